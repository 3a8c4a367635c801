"""The schedule generators, checked without MPI."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringtree.algorithms import ALGORITHMS
from ringtree.algorithms.tree import binomial_family
from ringtree.schedule import INPUT, OUTPUT, Op, OpKind, Ref, Schedule, ScheduleBuilder, even_chunks
from ringtree.sim.verify import ScheduleError, allreduce_schedules, verify, verify_schedules


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 7, 8, 16])
def test_every_rank_ends_with_every_input_once(algorithm, nranks):
    for count in sorted({0, 1, nranks - 1, nranks, nranks + 1, 13, 97, 4 * nranks + 3}):
        verify(algorithm, nranks, count)


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), nranks=st.integers(1, 24), count=st.integers(0, 300))
def test_generated_schedules_are_well_formed(algorithm, nranks, count):
    schedules = allreduce_schedules(algorithm, nranks, count)
    channels = {}
    for s in schedules:
        sizes = s.buffer_sizes()
        for i, op in enumerate(s.ops):
            assert all(0 <= d < i for d in op.deps)
            for ref in op.regions:
                assert 0 <= ref.offset and ref.end <= sizes[ref.buffer] and ref.count > 0
            assert (op.peer is not None) == (op.kind in (OpKind.SEND, OpKind.RECV))
            assert op.dst is None or op.dst.buffer != INPUT
            if op.kind is OpKind.SEND:
                channels.setdefault((s.rank, op.peer), [[], []])[0].append(op.src.count)
            elif op.kind is OpKind.RECV:
                channels.setdefault((op.peer, s.rank), [[], []])[1].append(op.dst.count)
    for (sender, receiver), (sends, recvs) in channels.items():
        assert sends == recvs, f"{sender}->{receiver}: sends {sends}, receives {recvs}"
    verify_schedules(schedules)


def _bytes_sent(schedule):
    return sum(op.src.count for op in schedule.ops if op.kind is OpKind.SEND)


@pytest.mark.parametrize("nranks", [2, 3, 4, 8, 13])
def test_ring_traffic_is_2_n_minus_1_over_n_of_the_data(nranks):
    count = 1000 * nranks + 7
    largest = max(size for _, size in even_chunks(count, nranks))
    for s in allreduce_schedules("ring", nranks, count):
        assert 2 * (nranks - 1) * (count // nranks) <= _bytes_sent(s) <= 2 * (nranks - 1) * largest


def test_tree_sends_the_whole_message_up_once_and_down_to_each_child():
    nranks, count = 8, 100
    for s in allreduce_schedules("tree", nranks, count):
        parent, children = binomial_family(nranks, s.rank)
        assert _bytes_sent(s) == count * ((parent is not None) + len(children))


def test_binomial_tree_shape():
    assert binomial_family(8, 0) == (None, [1, 2, 4])
    assert binomial_family(8, 6) == (4, [7])
    assert binomial_family(5, 4) == (0, [])
    assert binomial_family(1, 0) == (None, [])


def test_builder_derives_dependencies_from_regions():
    b = ScheduleBuilder("demo", 2, 0, 4)
    slot = b.scratch("slot", 2)
    b.copy(Ref(OUTPUT, 0, 4), Ref(INPUT, 0, 4))  # 0
    b.recv(1, slot)  # 1
    b.reduce(Ref(OUTPUT, 0, 2), Ref(OUTPUT, 0, 2), slot)  # 2: after the copy (RAW) and the receive (RAW)
    b.send(1, Ref(OUTPUT, 2, 2))  # 3: after the copy only
    b.recv(1, slot)  # 4: after the reduce has read the slot (WAR), the first receive (WAW)
    b.recv(1, Ref(OUTPUT, 2, 2))  # 5: after the send has read the region (WAR)
    b.send(1, Ref(OUTPUT, 0, 0))  # empty: dropped
    deps = [op.deps for op in b.build().ops]
    assert deps == [(), (), (0, 1), (0,), (1, 2), (0, 3)]


def test_builder_rejects_out_of_bounds_and_bad_peers():
    b = ScheduleBuilder("demo", 2, 0, 4)
    with pytest.raises(ValueError, match="out of bounds"):
        b.send(1, Ref(OUTPUT, 3, 2))
    with pytest.raises(ValueError, match="bad peer"):
        b.send(0, Ref(OUTPUT, 0, 1))


def _planted(algorithm, nranks, count, rank, change):
    schedules = allreduce_schedules(algorithm, nranks, count)
    s = schedules[rank]
    schedules[rank] = Schedule(s.algorithm, s.nranks, s.rank, s.count, s.scratch, tuple(change(list(s.ops))))
    return schedules


def _first(ops, kind):
    return next(i for i, op in enumerate(ops) if op.kind is kind)


def test_verifier_catches_a_dropped_send():
    def drop(ops):
        i = _first(ops, OpKind.SEND)
        return ops[:i] + [o._replace(deps=tuple(d - (d > i) for d in o.deps if d != i)) for o in ops[i + 1:]]
    with pytest.raises(ScheduleError, match="deadlock"):
        verify_schedules(_planted("ring", 4, 8, 1, drop))


def test_verifier_catches_a_doubled_reduce():
    def double(ops):
        i = _first(ops, OpKind.REDUCE)
        # Ops that waited for the reduce now wait for its double too, so the schedule has no race.
        return ops[:i + 1] + [Op(OpKind.REDUCE, ops[i].dst, (ops[i].dst, ops[i].srcs[0]), None, (i,))] + \
            [o._replace(deps=tuple(d + (d > i) for d in o.deps) + ((i + 1,) if i in o.deps else ()))
             for o in ops[i + 1:]]
    with pytest.raises(ScheduleError, match="not every rank's input once"):
        verify_schedules(_planted("tree", 4, 8, 0, double))


def test_verifier_catches_a_message_of_the_wrong_size():
    def shrink(ops):
        i = _first(ops, OpKind.SEND)
        src = ops[i].src
        ops[i] = ops[i]._replace(srcs=(Ref(src.buffer, src.offset, src.count - 1),))
        return ops
    with pytest.raises(ScheduleError, match="sends 1 elements but rank"):
        verify_schedules(_planted("ring", 2, 4, 0, shrink))


def test_verifier_catches_an_order_that_deadlocks_only_when_run_step_by_step():
    # Both ranks list a receive before their send, apart: the engine posts both at once and finishes,
    # but a runner that blocks on each step in order waits forever on both sides.
    schedules = []
    for rank in range(2):
        b = ScheduleBuilder("planted", 2, rank, 4)
        incoming = b.scratch("incoming", 4)
        mine, result = Ref(INPUT, 0, 4), Ref(OUTPUT, 0, 4)
        b.recv(1 - rank, incoming)
        b.copy(result, mine)
        b.send(1 - rank, mine)
        b.reduce(result, result, incoming)
        schedules.append(b.build())
    verify_schedules(schedules, stepwise=False)
    with pytest.raises(ScheduleError, match="deadlock when run step by step"):
        verify_schedules(schedules)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_verifies_on_1_to_64_ranks(algorithm):
    for nranks in range(1, 65):
        verify(algorithm, nranks, 2 * nranks + 1)  # uneven chunks wherever chunks exist


def test_verifier_catches_a_race():
    def unordered(ops):
        i = _first(ops, OpKind.REDUCE)  # it reads the slot a receive writes; drop what orders them
        ops[i] = ops[i]._replace(deps=())
        return ops
    with pytest.raises(ScheduleError, match="with no dependency between them"):
        verify_schedules(_planted("ring", 4, 8, 1, unordered))


def test_verifier_catches_a_swapped_region():
    def swap(ops):  # the first two sends carry each other's chunk
        i = _first(ops, OpKind.SEND)
        j = next(k for k in range(i + 1, len(ops)) if ops[k].kind is OpKind.SEND)
        ops[i], ops[j] = ops[i]._replace(srcs=ops[j].srcs), ops[j]._replace(srcs=ops[i].srcs)
        return ops
    # Now the moved send reads a chunk that a receive overwrites, unordered: named as a race.
    with pytest.raises(ScheduleError, match=r"rank 0: op 3 \(send input\[0:2\] to 1\) and op 7 .* both touch"):
        verify_schedules(_planted("ring", 3, 6, 0, swap), stepwise=False)


def test_verifier_catches_a_cyclic_wait():
    # Every rank first receives, then sends what it received: each waits for its left neighbour, around the ring.
    schedules = []
    for rank in range(3):
        b = ScheduleBuilder("planted", 3, rank, 3)
        incoming = b.scratch("incoming", 3)
        b.recv((rank - 1) % 3, incoming)
        b.reduce(Ref(OUTPUT, 0, 3), Ref(INPUT, 0, 3), incoming)
        b.send((rank + 1) % 3, Ref(OUTPUT, 0, 3))
        schedules.append(b.build())
    with pytest.raises(ScheduleError, match=r"deadlock: these ops can never finish: rank 0 op 0 \(recv"):
        verify_schedules(schedules)
