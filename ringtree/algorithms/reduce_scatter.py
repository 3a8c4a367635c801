"""Reduce-scatter: rank r ends with block r of the total of every rank's input.

ring                in N-1 steps a rank adds its input to the partial sum coming from its
                    left neighbour and passes it on to the right; the partial sum of block r
                    completes at rank r. Each rank sends (N-1)/N of the data.
recursive_halving   log2 P rounds among P = 2^⌊log2 N⌋ ranks: partners swap the half of the
                    blocks they share that the other keeps, and add the half they keep.
                    Each rank sends (P-1)/P of the data, in log2 P messages; when N is not a
                    power of two, each of the first N - P odd ranks first hands its input to
                    the even rank below it and gets its block back at the end.
pairwise            N-1 messages at once: rank r sends block r+s to rank r+s and adds the
                    block r that rank r-s sends it, s = 1 … N-1. Fewest steps in sequence.
"""

from __future__ import annotations

from collections.abc import Callable

from ..schedule.ir import INPUT, KEPT, OUTPUT, Collective, Ref, Schedule, ScheduleBuilder, blocks, single_rank


def ring_reduce_scatter(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("ring", count, collective)
    b = ScheduleBuilder("ring", nranks, rank, count, collective)
    regions = blocks(collective.counts)
    right, left = (rank + 1) % nranks, (rank - 1) % nranks

    def block(index: int) -> Ref:
        return Ref(INPUT, *regions[index % nranks])

    # Two of each, so the next partial sum can arrive, and be added to, while this one is sent on.
    # The sums are kept apart from the receive slots, which segmenting shrinks to a window of them.
    largest = max(collective.counts)
    incoming = b.scratch("incoming", 2 * largest)
    sums = b.scratch(KEPT + "sums", 2 * largest)
    partial = block(rank - 1)
    for step in range(nranks - 1):
        b.send(right, partial)
        arriving = (rank - step - 2) % nranks
        size = collective.counts[arriving]
        slot = Ref(incoming.buffer, (step % 2) * largest, size)
        b.recv(left, slot)
        partial = Ref(OUTPUT, 0, size) if arriving == rank else Ref(sums.buffer, (step % 2) * largest, size)
        b.reduce(partial, slot, block(arriving))
    return b.build()


def pairwise_reduce_scatter(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("pairwise", count, collective)
    b = ScheduleBuilder("pairwise", nranks, rank, count, collective)
    regions = blocks(collective.counts)
    mine = collective.counts[rank]
    incoming = b.scratch("incoming", 2 * mine)
    total, partial = Ref(OUTPUT, 0, mine), Ref(INPUT, *regions[rank])
    for distance in range(1, nranks):
        to = (rank + distance) % nranks
        b.send(to, Ref(INPUT, *regions[to]))
        slot = Ref(incoming.buffer, (distance % 2) * mine, mine)
        b.recv((rank - distance) % nranks, slot)
        b.reduce(total, partial, slot)
        partial = total
    return b.build()


def recursive_halving_reduce_scatter(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("recursive_halving", count, collective)
    b = ScheduleBuilder("recursive_halving", nranks, rank, count, collective)
    regions = blocks(collective.counts)
    mine = Ref(OUTPUT, 0, collective.counts[rank])
    fold = Folding(nranks)
    if fold.sits_out(rank):
        b.send(rank - 1, Ref(INPUT, 0, count))
        b.recv(rank - 1, mine)
        return b.build()
    position = fold.position(rank)

    def start(p: int) -> int:  # the first element of position p's blocks
        return regions[fold.rank_at(p)][0] if p < fold.positions else count

    partials = b.scratch(KEPT + "partials", count)
    source = INPUT
    if fold.takes_in(rank):
        slot = b.scratch("folded", count)
        b.recv(rank + 1, slot)
        b.reduce(partials, Ref(INPUT, 0, count), slot)
        source = partials.buffer
    held = halving_rounds(b, position, fold.positions, fold.rank_at, start, source, partials.buffer)
    if fold.takes_in(rank):
        b.send(rank + 1, Ref(held, *regions[rank + 1]))
    b.copy(mine, Ref(held, *regions[rank]))
    return b.build()


class Folding:
    """Ranks paired off down to a power of two: of the first 2(N - P) ranks, P = 2^⌊log2 N⌋, each odd
    one sits out and hands its part to the even one below it (Thakur, Rabenseifner and Gropp, 2005).
    The P ranks left take positions 0 … P-1, in rank order."""

    def __init__(self, nranks: int) -> None:
        self.positions = 1 << (nranks.bit_length() - 1)
        self.extra = nranks - self.positions

    def sits_out(self, rank: int) -> bool:
        return rank < 2 * self.extra and rank % 2 == 1

    def takes_in(self, rank: int) -> bool:
        return rank < 2 * self.extra and rank % 2 == 0

    def position(self, rank: int) -> int:
        return rank // 2 if rank < 2 * self.extra else rank - self.extra

    def rank_at(self, position: int) -> int:
        return 2 * position if position < self.extra else position + self.extra


def halving_rounds(b: ScheduleBuilder, position: int, positions: int, rank_of: Callable[[int], int],
                   start: Callable[[int], int], source: str, partials: str) -> str:
    """Recursive halving among `positions` (a power of two; position p is rank rank_of(p)), position
    p's part being elements [start(p), start(p + 1)): this rank sends its partial sums of the half it gives away, from
    `source` (at first; then `partials`, where the sums of the half it keeps go, over one receive
    slot). Returns the buffer that ends holding the total of this position's part."""
    lo, hi = 0, positions
    distance = positions // 2
    half = start(distance)
    incoming = b.scratch("incoming", half if position < distance else start(positions) - half).buffer
    while distance:
        partner = position ^ distance
        mid = lo + distance
        lower = position < partner
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        first, end = start(keep[0]), start(keep[1])
        b.send(rank_of(partner), Ref(source, start(give[0]), start(give[1]) - start(give[0])))
        slot = Ref(incoming, 0, end - first)
        b.recv(rank_of(partner), slot)
        own = Ref(source, first, end - first)
        b.reduce(Ref(partials, first, end - first), *((own, slot) if lower else (slot, own)))
        source = partials
        lo, hi = keep
        distance //= 2
    return source
