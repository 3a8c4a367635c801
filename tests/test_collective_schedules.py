"""The reduce-scatter, allgather, broadcast and reduce generators, checked without MPI: each verified
against its own postcondition, and its traffic in the simulator against its closed form."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringtree.algorithms import GENERATORS
from ringtree.algorithms.broadcast import subtree_size
from ringtree.algorithms.tree import binomial_family
from ringtree.schedule import INPUT, OpKind, ScheduleBuilder
from ringtree.schedule.ir import Collective, even_chunks
from ringtree.sim.result import Costs
from ringtree.sim.simulator import simulate
from ringtree.sim.verify import ScheduleError, allreduce_schedules, verify, verify_schedules

BLOCKED = ("reduce_scatter", "allgather")
ROOTED = ("broadcast", "reduce")
CASES = [(name, algorithm) for name in (*BLOCKED, *ROOTED) for algorithm in sorted(GENERATORS[name])]
COSTS = Costs(alpha=1e-6, beta=1e-9, gamma=1e-10)


def _shapes(name: str, nranks: int):
    """(count, Collective) pairs: counts 0, 1, N±1, primes and more than a segment; uneven blocks
    with zeros; every root."""
    counts = sorted({0, 1, max(nranks - 1, 0), nranks + 1, 13, 97, 4 * nranks + 3})
    if name in BLOCKED:
        for count in counts:
            yield count, Collective(name, tuple(size for _, size in even_chunks(count, nranks)))
        uneven = tuple((0, 1, 5, 0, 17, 2, 3)[r % 7] for r in range(nranks))
        yield sum(uneven), Collective(name, uneven)
    else:
        for root in range(nranks):
            for count in counts if root in (0, nranks - 1) else (nranks + 1,):
                yield count, Collective(name, (), root)


@pytest.mark.parametrize("name,algorithm", CASES)
@pytest.mark.parametrize("nranks", range(1, 17))
def test_every_generator_computes_its_collective_on_1_to_16_ranks(name, algorithm, nranks):
    for count, collective in _shapes(name, nranks):
        verify(algorithm, nranks, count, collective=collective)
        verify(algorithm, nranks, count, segment=4, collective=collective)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASES), nranks=st.integers(1, 20), data=st.data())
def test_generated_schedules_verify_for_any_blocks_root_and_segment(case, nranks, data):
    name, algorithm = case
    segment = data.draw(st.sampled_from([0, 1, 3, 64]))
    if name in BLOCKED:
        counts = tuple(data.draw(st.lists(st.integers(0, 40), min_size=nranks, max_size=nranks)))
        count, collective = sum(counts), Collective(name, counts)
    else:
        count, collective = data.draw(st.integers(0, 300)), Collective(name, (), data.draw(st.integers(0, nranks - 1)))
    verify(algorithm, nranks, count, segment=segment, staged=data.draw(st.booleans()), collective=collective)


def _planted(algorithm, nranks, count, collective, rank, change):
    """The schedules with rank `rank`'s ops changed, and their dependencies derived anew."""
    schedules = allreduce_schedules(algorithm, nranks, count, collective=collective)
    b = ScheduleBuilder.like(schedules[rank])
    for name, size in schedules[rank].scratch:
        b.scratch(name, size)
    for op in change(list(schedules[rank].ops)):
        b.add(op)
    schedules[rank] = b.build()
    return schedules


def test_verifier_catches_an_allgather_block_put_in_the_wrong_place():
    collective = Collective("allgather", (2, 2, 2))

    def misplace(ops):  # the last receive lands one block too far on
        i = max(i for i, op in enumerate(ops) if op.kind is OpKind.RECV)
        dst = ops[i].dst
        ops[i] = ops[i]._replace(dst=dst._replace(offset=(dst.offset + 2) % 6))
        return ops
    with pytest.raises(ScheduleError, match=r"rank 0: output\[\d\] holds contributions .*not rank \d's input"):
        verify_schedules(_planted("ring", 3, 6, collective, 0, misplace))


def test_verifier_catches_a_reduce_scatter_that_keeps_the_wrong_block():
    collective = Collective("reduce_scatter", (2, 2, 2))

    def shifted(ops):  # the last reduction adds this rank's input of the next block
        i = max(i for i, op in enumerate(ops) if op.kind is OpKind.REDUCE)
        slot, own = ops[i].srcs
        ops[i] = ops[i]._replace(srcs=(slot, own._replace(offset=(own.offset + 2) % 6)))
        return ops
    with pytest.raises(ScheduleError, match="of different input elements added where element 2 belongs"):
        verify_schedules(_planted("ring", 3, 6, collective, 1, shifted))


def test_verifier_catches_a_broadcast_from_the_wrong_root():
    schedules = allreduce_schedules("binomial", 4, 5, collective=Collective("broadcast", (), 0))
    wrong = allreduce_schedules("binomial", 4, 5, collective=Collective("broadcast", (), 1))
    with pytest.raises(ScheduleError):
        verify_schedules([wrong[0], *schedules[1:]])


def test_no_generator_writes_its_input():
    for name, algorithm in CASES:
        for count, collective in _shapes(name, 5):
            for s in allreduce_schedules(algorithm, 5, count, collective=collective):
                assert all(op.dst is None or op.dst.buffer != INPUT for op in s.ops)


def _traffic(collective, algorithm, nranks, count, root=0):
    result = simulate(algorithm, nranks, count, COSTS, itemsize=1, collective=collective, root=root)
    return result.bytes_sent, result.bytes_received


@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8, 13])
def test_reduce_scatter_traffic_is_n_minus_1_over_n_of_the_data(nranks):
    count = 1000 * nranks
    share = (nranks - 1) * 1000
    for algorithm in ("ring", "pairwise"):
        assert _traffic("reduce_scatter", algorithm, nranks, count) == ((share,) * nranks, (share,) * nranks)
    # Recursive halving: what a rank's position does not keep, and for a pair folded into one
    # position, one rank's input over and its block back.
    sent, received = _traffic("reduce_scatter", "recursive_halving", nranks, count)
    extra = nranks - (1 << (nranks.bit_length() - 1))
    for rank in range(nranks):
        folded = rank < 2 * extra
        if folded and rank % 2:
            assert (sent[rank], received[rank]) == (count, 1000)
        else:  # each round gives away half of what is left, and receives the half kept
            position, positions = (rank // 2 if folded else rank - extra), nranks - extra
            width = [2000 if p < extra else 1000 for p in range(positions)]
            lo, hi, kept = 0, positions, 0
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if position < mid else (mid, hi)
                kept += sum(width[lo:hi])
            assert (sent[rank], received[rank]) == (count - width[position] + 1000 * folded, kept + count * folded)


@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8, 13])
def test_allgather_traffic_is_n_minus_1_over_n_of_the_data(nranks):
    count = 1000 * nranks
    share = (nranks - 1) * 1000
    for algorithm in ("ring", "bruck"):
        assert _traffic("allgather", algorithm, nranks, count) == ((share,) * nranks, (share,) * nranks)
    if nranks & (nranks - 1) == 0:
        assert _traffic("allgather", "recursive_doubling", nranks, count) == ((share,) * nranks, (share,) * nranks)


@pytest.mark.parametrize("nranks", [2, 3, 4, 7, 8])
@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_traffic(nranks, root):
    count = 1000 * nranks
    sent, received = _traffic("broadcast", "binomial", nranks, count, root)
    for rank in range(nranks):
        parent, children = binomial_family(nranks, (rank - root) % nranks)
        assert (sent[rank], received[rank]) == (count * len(children), count * (parent is not None))
    sent, received = _traffic("broadcast", "chain", nranks, count, root)
    assert sorted(sent) == [0] + [count] * (nranks - 1) and received[root] == 0 and sum(received) == sum(sent)
    sent, received = _traffic("broadcast", "scatter_allgather", nranks, count, root)
    assert received[root] == 0 and all(received[r] == count for r in range(nranks) if r != root)
    assert max(sent) <= 2 * count


@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8])
def test_reduce_traffic(nranks):
    count, root = 1000 * 8, nranks - 1
    sent, received = _traffic("reduce", "binomial", nranks, count, root)
    assert sent[root] == 0 and all(sent[r] == count for r in range(nranks) if r != root)
    sent, received = _traffic("reduce", "rabenseifner", nranks, count, root)
    positions = 1 << (nranks.bit_length() - 1)
    chunk = count // positions
    if positions == nranks:  # no folding: the reduce-scatter's share, then the chunks of its subtree
        for rank in range(nranks):
            position = (rank - root) % nranks
            gathered = 0 if position == 0 else subtree_size(positions, position) * chunk
            assert sent[rank] == count - chunk + gathered
    assert received[root] == count - chunk + (count - chunk) + (count if positions < nranks else 0)


ALLTOALL = sorted(GENERATORS["alltoall"])


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALLTOALL)
@pytest.mark.parametrize("nranks", range(1, 17))
def test_every_alltoall_generator_computes_alltoall_on_1_to_16_ranks(algorithm, nranks):
    for block in (0, 1, 3, 13):
        collective = Collective("alltoall", (block,) * nranks)
        for segment in (0, 1, 4):
            verify(algorithm, nranks, block * nranks, segment=segment, collective=collective)
        verify(algorithm, nranks, block * nranks, staged=True, collective=collective)
        for s in allreduce_schedules(algorithm, nranks, block * nranks, collective=collective):
            assert all(op.dst is None or op.dst.buffer != INPUT for op in s.ops)


def test_alltoall_blocks_must_be_alike():
    with pytest.raises(ValueError, match="must be 2 alike"):
        Collective("alltoall", (2, 3)).check(2, 5)
    with pytest.raises(ValueError, match="not all alike"):  # such a matrix is given as N counts
        Collective("alltoall", (2,) * 4).check(2, 8)


def _count_matrix(nranks: int, seed: int) -> tuple[int, ...]:
    """What each rank sends each, row by row: sizes of 0 to 5, not all alike."""
    counts = tuple(int(c) for c in np.random.default_rng(seed).integers(0, 6, nranks * nranks))
    return counts if len(set(counts)) > 1 else (counts[0] + 1, *counts[1:])


@pytest.mark.parametrize("nranks", range(2, 17))
def test_pairwise_alltoall_of_a_matrix_of_counts_on_2_to_16_ranks(nranks):
    for seed in range(3):
        collective = Collective("alltoall", _count_matrix(nranks, seed))
        count = sum(collective.counts)
        for segment in (0, 1, 4):
            verify("pairwise", nranks, count, segment=segment, collective=collective)
        # Staged (device memory) plans never run stepwise: their backends are asynchronous (runtime/session/plan.py).
        verify_schedules(allreduce_schedules("pairwise", nranks, count, staged=True, collective=collective),
                         stepwise=False)


def test_bruck_refuses_a_matrix_of_counts():
    with pytest.raises(ValueError, match="blocks alike only"):
        verify("bruck", 3, 12, collective=Collective("alltoall", (1, 2, 1, 2, 1, 1, 1, 2, 1)))


def test_verifier_catches_a_block_of_a_matrix_put_in_the_wrong_place():
    collective = Collective("alltoall", (1, 2, 3, 0, 2, 1, 1, 1, 2))  # rank 1 receives 2 + 2 + 1

    def misplace(ops):  # its block from rank 0 written one element on
        i = next(i for i, op in enumerate(ops) if op.kind is OpKind.RECV and op.peer == 0)
        ops[i] = ops[i]._replace(dst=ops[i].dst._replace(offset=1))
        return ops
    with pytest.raises(ScheduleError, match=r"rank 1: output\[\d\] holds"):
        verify_schedules(_planted("pairwise", 3, sum(collective.counts), collective, 1, misplace))


@pytest.mark.parametrize("algorithm", ALLTOALL)
def test_verifier_catches_an_alltoall_block_put_in_the_wrong_place(algorithm):
    collective = Collective("alltoall", (2,) * 4)

    def misplace(ops):  # the last write of the output lands one block too far on
        i = max(i for i, op in enumerate(ops) if op.dst is not None and op.dst.buffer == "output")
        dst = ops[i].dst
        ops[i] = ops[i]._replace(dst=dst._replace(offset=(dst.offset + 2) % 8))
        return ops
    with pytest.raises(ScheduleError, match=r"rank 1: output\[\d\] holds"):
        verify_schedules(_planted(algorithm, 4, 8, collective, 1, misplace))


@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8, 13])
def test_alltoall_traffic(nranks):
    """Pairwise sends each block but its own once: (N-1)/N of the data; Bruck sends, in each round,
    the blocks whose position has that round's bit: a block goes as often as its position has bits."""
    block = 100
    count = block * nranks
    share = (nranks - 1) * block
    assert _traffic("alltoall", "pairwise", nranks, count) == ((share,) * nranks, (share,) * nranks)
    moved = sum(bin(position).count("1") for position in range(nranks)) * block
    assert _traffic("alltoall", "bruck", nranks, count) == ((moved,) * nranks, (moved,) * nranks)
