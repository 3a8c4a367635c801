"""The segmenting pass, checked without MPI against the unsegmented schedules."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringtree.algorithms import ALGORITHMS
from ringtree.algorithms.lower import Shape, lower
from ringtree.schedule import INPUT, OUTPUT, OpKind
from ringtree.schedule.pipeline import SLOTS, segmented
from ringtree.schedule.topology import Topology
from ringtree.sim.verify import allreduce_schedules, verify_schedules


def _messages(schedule):
    """Per channel, the (buffer, offset, count) of each message, scratch buffers named alike."""
    channels = {}
    for op in schedule.ops:
        if op.peer is not None:
            ref = op.src if op.kind is OpKind.SEND else op.dst
            name = ref.buffer if ref.buffer in (INPUT, OUTPUT) else "scratch"
            channels.setdefault((op.kind, op.peer), []).append((name, ref.offset if name != "scratch" else None,
                                                                ref.count))
    return channels


def _joined(pieces):
    """Consecutive pieces of one region merged back, as far as they are contiguous."""
    merged = []
    for name, offset, count in pieces:
        if merged and name == merged[-1][0] and name != "scratch" and merged[-1][1] + merged[-1][2] == offset:
            merged[-1] = (name, merged[-1][1], merged[-1][2] + count)
        else:
            merged.append((name, offset, count))
    return merged


@settings(max_examples=80, deadline=None)
@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), nranks=st.integers(1, 9), count=st.integers(0, 200),
       segment=st.integers(1, 64), window=st.integers(1, 5), ahead=st.booleans())
def test_segmenting_keeps_the_collective_and_bounds_scratch(algorithm, nranks, count, segment, window, ahead):
    plain = allreduce_schedules(algorithm, nranks, count)
    split = [segmented(s, segment, window, ahead) for s in plain]
    verify_schedules(split, stepwise=False)  # still an allreduce, and the engine cannot deadlock on it
    for before, after in zip(plain, split):
        # every op becomes ceil(c / segment) pieces of at most `segment` elements
        assert len(after.ops) == sum(math.ceil(op.regions[0].count / segment) for op in before.ops)
        assert all(op.regions[0].count <= segment for op in after.ops)
        # scratch is a ring of `window` slots of at most one segment, whatever the count
        assert all(name == SLOTS and size <= segment * window for name, size in after.scratch)
        # each channel carries the same data in the same order, cut into segments
        old, new = _messages(before), _messages(after)
        assert old.keys() == new.keys()
        for channel in old:
            assert [c for _, _, c in old[channel]] == _regroup([c for _, _, c in new[channel]], old[channel])
            assert [m for m in _joined(new[channel]) if m[0] != "scratch"] == \
                [m for m in _joined(old[channel]) if m[0] != "scratch"]


def _regroup(piece_counts, messages):
    """Sum consecutive piece sizes back into the sizes of the original messages."""
    sizes, i = [], 0
    for _, _, count in messages:
        total = 0
        while total < count:
            total += piece_counts[i]
            i += 1
        sizes.append(total)
    assert i == len(piece_counts)
    return sizes


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_piece_of_a_reduction_waits_only_for_its_own_piece_of_the_receive(algorithm):
    nranks, count, segment = 4, 64, 4
    for s in allreduce_schedules(algorithm, nranks, count):
        after = segmented(s, segment, window=4)
        for i, op in enumerate(after.ops):
            if op.kind is OpKind.REDUCE:
                received = [after.ops[d] for d in op.deps if after.ops[d].kind is OpKind.RECV]
                assert all(r.dst.count == op.dst.count for r in received)
                assert all(r.dst in op.srcs for r in received), f"rank {s.rank} op {i} waits for other pieces"


def receives_ahead(schedule):
    """For each receive into scratch that waits for a reduction of data received on its own channel:
    how many receives on that channel before it the data came."""
    ops, seen, lags = schedule.ops, {}, set()
    for i, op in enumerate(ops):
        if op.kind is OpKind.RECV and op.dst.buffer == SLOTS:
            channel = seen.setdefault(op.peer, [])
            for d in (d for d in op.deps if ops[d].kind is OpKind.REDUCE):
                lags.update(len(channel) - channel.index(r) for r in ops[d].deps if r in channel)
            channel.append(i)
    return lags


def test_the_hierarchical_allreduce_posts_receives_ahead_where_ranks_of_a_node_share_its_link():
    def lags(algorithm, layout):
        topology = Topology.placed(layout) if len(layout) > 1 else None
        return receives_ahead(lower(Shape(algorithm, sum(layout), 0, 64, segment=4, window=4, topology=topology)).schedule)

    assert lags("hierarchical", [2, 2]) == {4}  # a window of 4 for each of its two channels (pools of their own)
    assert lags("hierarchical", [4]) == {1}  # one node
    assert lags("ring", [2, 2]) == lags("ring", [4]) == {1}


def test_each_pool_of_scratch_has_a_window_of_slots_of_its_own():
    # The hierarchical allreduce's receives across nodes wait on other nodes: in slots shared with
    # the ring in the node they could hold every slot that ring needs to feed the other nodes.
    topology, segment, window = Topology.placed([2, 2]), 4, 3
    for rank in range(topology.nranks):
        schedule = lower(Shape("hierarchical", topology.nranks, rank, 96, segment, window, topology=topology)).schedule
        assert schedule.scratch == ((SLOTS, segment * window * 2),)
        slots = {True: set(), False: set()}  # of receives from other nodes, from this node
        for op in schedule.ops:
            if op.kind is OpKind.RECV and op.dst.buffer == SLOTS:
                slots[topology.node_of[op.peer] != topology.node_of[rank]].add(op.dst.offset // segment)
        assert len(slots[True]) == len(slots[False]) == window and not slots[True] & slots[False], (rank, slots)


def test_segmenting_rejects_nonsense():
    schedule = allreduce_schedules("ring", 2, 10)[0]
    with pytest.raises(ValueError, match="must be positive"):
        segmented(schedule, 0)
