"""Allgather: every rank ends with every rank's input, block r from rank r.

ring                in N-1 steps a rank passes the block it got last on to its right
                    neighbour. Each rank sends and receives (N-1)/N of the data.
recursive_doubling  log2 P rounds among P = 2^⌊log2 N⌋ ranks: partners swap everything they
                    hold, doubling it. When N is not a power of two, each of the first N - P odd
                    ranks first hands its block to the even rank below it, and gets the whole
                    result from it at the end.
bruck               ⌈log2 N⌉ rounds for any N: in round k rank r sends the blocks r … r+2^k-1
                    it holds to rank r-2^k and gets blocks r+2^k … from rank r+2^k, each
                    written straight to its place (no final rotation).
"""

from __future__ import annotations

from ..schedule.ir import INPUT, OUTPUT, Collective, Ref, Schedule, ScheduleBuilder, blocks, single_rank
from .reduce_scatter import Folding


def ring_allgather(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("ring", count, collective)
    b = ScheduleBuilder("ring", nranks, rank, count, collective)
    regions = blocks(collective.counts)

    def block(index: int) -> Ref:
        return Ref(OUTPUT, *regions[index % nranks])

    right, left = (rank + 1) % nranks, (rank - 1) % nranks
    mine = Ref(INPUT, 0, collective.counts[rank])
    b.copy(block(rank), mine)
    for step in range(nranks - 1):
        b.send(right, mine if step == 0 else block(rank - step))
        b.recv(left, block(rank - step - 1))
    return b.build()


def recursive_doubling_allgather(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("recursive_doubling", count, collective)
    b = ScheduleBuilder("recursive_doubling", nranks, rank, count, collective)
    regions = blocks(collective.counts)
    mine = Ref(INPUT, 0, collective.counts[rank])
    everything = Ref(OUTPUT, 0, count)
    fold = Folding(nranks)
    if fold.sits_out(rank):
        b.send(rank - 1, mine)
        b.recv(rank - 1, everything)
        return b.build()
    b.copy(Ref(OUTPUT, *regions[rank]), mine)
    if fold.takes_in(rank):
        b.recv(rank + 1, Ref(OUTPUT, *regions[rank + 1]))

    def held(first: int, end: int) -> Ref:  # the blocks of positions [first, end)
        lo = regions[fold.rank_at(first)][0]
        hi = regions[fold.rank_at(end)][0] if end < fold.positions else count
        return Ref(OUTPUT, lo, hi - lo)

    position = fold.position(rank)
    distance = 1
    while distance < fold.positions:
        partner = position ^ distance
        base, partner_base = position & -distance, partner & -distance
        own = held(base, base + distance)
        b.send(fold.rank_at(partner), mine if distance == 1 and not fold.takes_in(rank) else own)
        b.recv(fold.rank_at(partner), held(partner_base, partner_base + distance))
        distance *= 2
    if fold.takes_in(rank):
        b.send(rank + 1, everything)
    return b.build()


def bruck_allgather(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("bruck", count, collective)
    b = ScheduleBuilder("bruck", nranks, rank, count, collective)
    regions = blocks(collective.counts)

    def spans(first: int, number: int) -> list[Ref]:
        """Blocks first … first+number-1 (mod N): one region, or two where they wrap past the last."""
        first %= nranks
        end = first + number
        found = [(first, min(end, nranks))] + ([(0, end - nranks)] if end > nranks else [])
        return [Ref(OUTPUT, regions[lo][0], regions[hi - 1][0] + regions[hi - 1][1] - regions[lo][0])
                for lo, hi in found]

    mine = Ref(INPUT, 0, collective.counts[rank])
    b.copy(Ref(OUTPUT, *regions[rank]), mine)
    have, distance = 1, 1
    while have < nranks:
        number = min(distance, nranks - have)
        for region in ([mine] if have == 1 else spans(rank, number)):
            b.send((rank - distance) % nranks, region)
        for region in spans(rank + distance, number):
            b.recv((rank + distance) % nranks, region)
        have += number
        distance *= 2
    return b.build()
