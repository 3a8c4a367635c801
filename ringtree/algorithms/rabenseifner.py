"""Rabenseifner's allreduce: a recursive-halving reduce-scatter, then a recursive-doubling allgather.

Among P = 2^⌊log2 N⌋ ranks, round k of the reduce-scatter pairs each rank with
the one whose position differs in bit P/2^(k+1); both split the region they
share in two, send one half, and reduce the half they keep, so after log2 P
rounds each rank holds the total of a 1/P share. The allgather runs the rounds
backwards, doubling the region each rank holds. Each rank sends and receives
2(P-1)/P of the message in 2·log2 P messages: the ring's bandwidth with the
latency of recursive doubling.

When N is not a power of two, the first 2r ranks (r = N - P) pair up first, as
in Thakur, Rabenseifner and Gropp (2005): the even rank of a pair sends the
upper half of its input to the odd one and receives the lower half of the odd
one's; each adds one half; the even rank sends its half-sum over, and sits out
until the odd rank hands it the result at the end.
"""

from ..schedule.ir import INPUT, OUTPUT, Ref, Schedule, ScheduleBuilder, single_rank


def rabenseifner_allreduce(nranks: int, rank: int, count: int) -> Schedule:
    if nranks == 1:
        return single_rank("rabenseifner", count)
    b = ScheduleBuilder("rabenseifner", nranks, rank, count)
    result = Ref(OUTPUT, 0, count)

    def region(buffer: str, lo: int, hi: int) -> Ref:
        return Ref(buffer, lo, hi - lo)

    incoming = b.scratch("incoming", count - count // 2)  # the larger half: the most any round receives

    def receive_and_reduce(peer: int, lo: int, hi: int, partial: str, peer_is_lower: bool) -> None:
        slot = Ref(incoming.buffer, 0, hi - lo)
        b.recv(peer, slot)
        own = region(partial, lo, hi)
        b.reduce(region(OUTPUT, lo, hi), *((slot, own) if peer_is_lower else (own, slot)))

    size = 1 << (nranks.bit_length() - 1)
    extra = nranks - size
    half = count // 2
    partial = INPUT  # the buffer that holds this rank's running partial sums
    if rank < 2 * extra:
        if rank % 2 == 0:  # give both halves away, get the result at the end
            b.send(rank + 1, region(INPUT, half, count))
            receive_and_reduce(rank + 1, 0, half, INPUT, peer_is_lower=False)
            b.send(rank + 1, region(OUTPUT, 0, half))
            b.recv(rank + 1, result)
            return b.build()
        b.send(rank - 1, region(INPUT, 0, half))
        receive_and_reduce(rank - 1, half, count, INPUT, peer_is_lower=True)
        b.recv(rank - 1, region(OUTPUT, 0, half))
        partial = OUTPUT
    position = rank // 2 if rank < 2 * extra else rank - extra

    def rank_at(p: int) -> int:
        return 2 * p + 1 if p < extra else p + extra

    # Reduce-scatter by recursive halving: keep the half on this rank's side of the partner.
    lo, hi = 0, count
    regions = []
    distance = size // 2
    while distance:
        partner_position = position ^ distance
        partner = rank_at(partner_position)
        mid = (lo + hi) // 2
        lower = position < partner_position
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        b.send(partner, region(partial, *give))
        receive_and_reduce(partner, *keep, partial, peer_is_lower=not lower)
        regions.append((partner, give))
        lo, hi = keep
        partial = OUTPUT
        distance //= 2

    # Allgather by recursive doubling: the same partners in reverse, each sending what it holds.
    for partner, give in reversed(regions):
        b.send(partner, region(OUTPUT, lo, hi))
        b.recv(partner, region(OUTPUT, *give))
        lo, hi = min(lo, give[0]), max(hi, give[1])

    if rank < 2 * extra:
        b.send(rank - 1, result)
    return b.build()
