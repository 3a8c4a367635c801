"""Hierarchical (node-aware) allreduce: reduce-scatter inside each node, allreduce of each shard
across nodes, allgather inside each node; what Horovod's hierarchical allreduce, NCCL and MPICH's
multi-leader compositions do.

The count is cut into M shards, M the most ranks on any node. On a node of p ranks, local rank i
owns the shards j with j·p // M == i (a contiguous run; every rank owns one when the nodes are
even, a rank of a smaller node owns several). The three phases:

1. the ring's reduce-scatter half among the node's ranks leaves each rank the node's sum of its
   shards, in place in OUTPUT;
2. for each run of shards with the same owners on every node, those owners (one per node) allreduce
   it: every local rank crosses between nodes at once, each with its share of the data, so every
   rank's link carries 2(K-1)/K of its shards, K nodes (a ring; recursive doubling for 2 nodes or
   small shards, where fewer steps matter more);
3. the ring's allgather half inside the node gives every rank the whole.

Phase 2 is an existing generator's schedule, its peers and regions moved into place: it works in
place on the rank's shards of OUTPUT.
"""

from __future__ import annotations

import dataclasses

from ..schedule.ir import INPUT, KEPT, OUTPUT, POOL, Op, OpKind, Ref, Schedule, ScheduleBuilder, even_chunks
from ..schedule.topology import Topology
from .recursive_doubling import recursive_doubling_allreduce
from .ring import ring_allgather_half, ring_allreduce, ring_reduce_scatter_half

# Shards of at most this many elements cross between nodes by recursive doubling (fewer steps),
# larger ones by the ring.
SMALL_SHARD = 16384


def hierarchical_allreduce(nranks: int, rank: int, count: int, topology: Topology | None = None) -> Schedule:
    topology = topology or Topology.flat(nranks)
    if topology.nranks != nranks:
        raise ValueError(f"a topology of {topology.nranks} ranks for an allreduce on {nranks}")
    if topology.nodes == 1:  # the node's ring: its two halves with nothing between them
        return dataclasses.replace(ring_allreduce(nranks, rank, count), algorithm="hierarchical")
    b = ScheduleBuilder("hierarchical", nranks, rank, count)
    node = topology.node_of[rank]
    local = topology.ranks_on(node)
    widest = max(topology.ranks_per_node)
    shards = even_chunks(count, widest)

    def owner(node: int, shard: int) -> int:
        ranks = topology.ranks_on(node)
        return ranks[shard * len(ranks) // widest]

    owned = [sum(size for j, (_, size) in enumerate(shards) if owner(node, j) == r) for r in local]
    blocks = [(sum(owned[:i]), size) for i, size in enumerate(owned)]
    # The ring's halves leave the rank at place p with chunk p + 1: chunk c is local rank c - 1's block.
    chunks = [blocks[(c - 1) % len(local)] for c in range(len(local))]

    runs: list[tuple[tuple[int, ...], int, int]] = []  # (owners, offset, count) of shards with the same owners
    for j, (offset, size) in enumerate(shards):
        owners = tuple(owner(n, j) for n in range(topology.nodes))
        if runs and runs[-1][0] == owners:
            runs[-1] = (owners, runs[-1][1], runs[-1][2] + size)
        else:
            runs.append((owners, offset, size))
    across = []
    for owners, offset, size in runs:
        if rank in owners:
            generator = recursive_doubling_allreduce if len(owners) == 2 or size <= SMALL_SHARD else ring_allreduce
            across.append((generator(len(owners), owners.index(rank), size), owners, offset))

    # Scratch: the ring's two receive slots in the node; the allreduces' across nodes, shared by the
    # runs at the largest size any needs, in a pool of their own: pipelined, receives across that
    # wait on other nodes would otherwise hold the slots the ring in the node needs to feed them.
    # Where some rank takes part in several runs, those are kept whole: pipelined runs of different
    # owners sharing a window of slots could wait on each other.
    incoming = b.scratch("incoming", 2 * max(owned)) if len(local) > 1 else None
    prefix = KEPT + "across" + POOL if len(runs) > min(topology.ranks_per_node) else "across" + POOL
    sizes: dict[str, int] = {}
    for inner, _, _ in across:
        for name, size in inner.scratch:
            sizes[name] = max(size, sizes.get(name, 0))
    places = {name: (b.scratch(prefix + name.removeprefix(KEPT), size).buffer, 0) for name, size in sizes.items()}

    if incoming is None:
        b.copy(Ref(OUTPUT, 0, count), Ref(INPUT, 0, count))
    else:
        ring_reduce_scatter_half(b, local, chunks, incoming)  # 1. the node's sum of this rank's shards
    for inner, owners, offset in across:  # 2. each run's sum over the nodes, in place
        _embed(b, inner, owners, {**places, INPUT: (OUTPUT, offset), OUTPUT: (OUTPUT, offset)})
    if incoming is not None:
        ring_allgather_half(b, local, chunks)  # 3. every shard to every rank of the node
    return b.build()


def _embed(b: ScheduleBuilder, inner: Schedule, ranks: tuple[int, ...], places: dict[str, tuple[str, int]]) -> None:
    """List `inner`'s ops in `b`: its rank i as ranks[i], each of its buffers at `places` (buffer,
    offset). A copy onto itself is left out."""

    def moved(ref: Ref) -> Ref:
        buffer, offset = places[ref.buffer]
        return Ref(buffer, offset + ref.offset, ref.count)

    for op in inner.ops:
        dst, srcs = (moved(op.dst) if op.dst is not None else None), tuple(map(moved, op.srcs))
        if op.kind is OpKind.COPY and dst == srcs[0]:
            continue
        b.add(Op(op.kind, dst, srcs, None if op.peer is None else ranks[op.peer]))
