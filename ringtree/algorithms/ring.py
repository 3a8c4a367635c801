"""Ring allreduce: a reduce-scatter, then an allgather, around the ring of ranks.

The count is split into one chunk per rank. In each of the N-1 reduce-scatter
steps a rank sends one chunk to its right neighbour and adds its own input to
the chunk coming from its left neighbour; afterwards rank r holds the total of
chunk r+1. In each of the N-1 allgather steps it passes a finished chunk on to
the right. Every rank sends and receives 2(N-1)/N of the data, whatever N.

Given a topology, the ring goes round the ranks node by node (Topology.node_order), so that it
crosses from one node to the next once per node whatever the placement; the chunks then go by
place on the ring, not by rank.
"""

import math

from ..schedule.ir import INPUT, OUTPUT, Ref, Schedule, ScheduleBuilder, even_chunks
from ..schedule.topology import Topology


def ring_allreduce(nranks: int, rank: int, count: int, topology: Topology | None = None) -> Schedule:
    b = ScheduleBuilder("ring", nranks, rank, count)
    order = topology.node_order if topology is not None else tuple(range(nranks))
    chunks = even_chunks(count, nranks)
    if nranks == 1:
        b.copy(Ref(OUTPUT, 0, count), Ref(INPUT, 0, count))
        return b.build()
    # Two receive slots, so the next chunk can arrive while this one is added.
    incoming = b.scratch("incoming", 2 * max(size for _, size in chunks))
    ring_reduce_scatter_half(b, order, chunks, incoming)
    ring_allgather_half(b, order, chunks)
    return b.build()


def ring_reduce_scatter_half(b: ScheduleBuilder, order, chunks: list[tuple[int, int]], incoming: Ref) -> None:
    """The ring's first half among the ranks `order` (b's rank among them), on OUTPUT's `chunks`
    (offset, size), one per rank: afterwards the rank at place p of `order` holds in OUTPUT the total of
    chunk p + 1 of every rank's INPUT. `incoming` holds two of the largest chunk."""
    n, place = len(order), order.index(b.rank)
    right, left = order[(place + 1) % n], order[(place - 1) % n]
    largest = incoming.count // 2
    for step in range(n - 1):
        sent = chunks[(place - step) % n]
        b.send(right, Ref(INPUT if step == 0 else OUTPUT, *sent))
        arriving = chunks[(place - step - 1) % n]
        partial = Ref(incoming.buffer, incoming.offset + (step % 2) * largest, arriving[1])
        b.recv(left, partial)
        b.reduce(Ref(OUTPUT, *arriving), partial, Ref(INPUT, *arriving))


def ring_allgather_half(b: ScheduleBuilder, order, chunks: list[tuple[int, int]]) -> None:
    """The ring's second half: the rank at place p of `order` passes on its total of chunk p + 1, and
    then each chunk that reaches it, until every rank holds every chunk in OUTPUT."""
    n, place = len(order), order.index(b.rank)
    right, left = order[(place + 1) % n], order[(place - 1) % n]
    for step in range(n - 1):
        b.send(right, Ref(OUTPUT, *chunks[(place + 1 - step) % n]))
        b.recv(left, Ref(OUTPUT, *chunks[(place - step) % n]))


def ring_turns(nranks: int, count: int) -> int:
    """The count whose rank 0 schedule every rank's is turned from around the ring: rank r's ops are
    that schedule's, in the same order, each peer p replaced by (p + r) mod nranks and each region in
    chunk c (of even_chunks) by the same place in chunk (c + r) mod nranks, a receive slot holding
    what the message brings; ops on chunks empty at `count` left out. That is `count` itself when no
    chunk is empty (chunks then differ by one element at most), else nranks: one element a chunk."""
    return count if count >= nranks or count == 0 else nranks


def ring_period(nranks: int, count: int) -> int:
    """A P such that rank r + P's schedule is rank r's with every peer p as (p + P) mod nranks: the
    chunks' lengths repeat every nranks / gcd(count, nranks) chunks (even_chunks' bounds are
    i·count // nranks), and rank r's ops are on chunks r - step."""
    return nranks // math.gcd(count, nranks)
