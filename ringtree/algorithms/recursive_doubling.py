"""Recursive-doubling allreduce: log2 N rounds of pairwise exchange, latency-optimal for small messages.

In round k, rank r exchanges its partial result with rank r XOR 2^k and both
combine the two halves, the lower rank's on the left, so every rank computes
bitwise the same value. When N is not a power of two, the first 2·(N - 2^⌊log2 N⌋)
ranks pair up first: each even one hands its input to the odd one above it,
sits out the rounds, and gets the result back at the end (Thakur, Rabenseifner
and Gropp, 2005).
"""

from ..schedule.ir import INPUT, OUTPUT, Ref, Schedule, ScheduleBuilder, single_rank


def recursive_doubling_allreduce(nranks: int, rank: int, count: int) -> Schedule:
    if nranks == 1:
        return single_rank("recursive_doubling", count)
    b = ScheduleBuilder("recursive_doubling", nranks, rank, count)
    mine, result = Ref(INPUT, 0, count), Ref(OUTPUT, 0, count)

    rounds_size = 1 << (nranks.bit_length() - 1)  # largest power of two <= nranks
    folded = nranks - rounds_size  # ranks 0, 2, ..., 2·folded - 2 sit out the rounds
    # Two buffers taken in turn, so a round's receive need not wait for the last round's reduction;
    # whole buffers rather than halves of one, so the lean path slices nothing.
    incoming = [b.scratch("incoming0", count), b.scratch("incoming1", count)]

    def slot(i: int) -> Ref:
        return incoming[i % 2]

    if rank < 2 * folded and rank % 2 == 0:
        b.send(rank + 1, mine)
        b.recv(rank + 1, result)
        return b.build()

    partial = mine
    if rank < 2 * folded:
        b.recv(rank - 1, slot(0))
        b.reduce(result, slot(0), mine)
        partial = result
    position = rank // 2 if rank < 2 * folded else rank - folded

    for k in range(rounds_size.bit_length() - 1):
        other = position ^ (1 << k)
        partner = 2 * other + 1 if other < folded else other + folded
        b.send(partner, partial)
        b.recv(partner, slot(k + 1))
        if other < position:
            b.reduce(result, slot(k + 1), partial)
        else:
            b.reduce(result, partial, slot(k + 1))
        partial = result

    if rank < 2 * folded:
        b.send(rank - 1, result)
    return b.build()
