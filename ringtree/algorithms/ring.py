"""Ring allreduce: a reduce-scatter, then an allgather, around the ring of ranks.

The count is split into one chunk per rank. In each of the N-1 reduce-scatter
steps a rank sends one chunk to its right neighbour and adds its own input to
the chunk coming from its left neighbour; afterwards rank r holds the total of
chunk r+1. In each of the N-1 allgather steps it passes a finished chunk on to
the right. Every rank sends and receives 2(N-1)/N of the data, whatever N.
"""

import math

from ..schedule.ir import INPUT, OUTPUT, Ref, Schedule, ScheduleBuilder, even_chunks


def ring_allreduce(nranks: int, rank: int, count: int) -> Schedule:
    b = ScheduleBuilder("ring", nranks, rank, count)
    chunks = even_chunks(count, nranks)
    refs = {buffer: [Ref(buffer, *c) for c in chunks] for buffer in (INPUT, OUTPUT)}

    def chunk(buffer: str, index: int) -> Ref:
        return refs[buffer][index % nranks]

    if nranks == 1:
        b.copy(chunk(OUTPUT, 0), chunk(INPUT, 0))
        return b.build()

    # Two receive slots, so the next chunk can arrive while this one is added.
    largest = max(size for _, size in chunks)
    incoming = b.scratch("incoming", 2 * largest)
    right, left = (rank + 1) % nranks, (rank - 1) % nranks

    for step in range(nranks - 1):
        b.send(right, chunk(INPUT if step == 0 else OUTPUT, rank - step))
        arriving = rank - step - 1
        partial = Ref(incoming.buffer, (step % 2) * largest, chunks[arriving % nranks][1])
        b.recv(left, partial)
        b.reduce(chunk(OUTPUT, arriving), partial, chunk(INPUT, arriving))

    for step in range(nranks - 1):
        b.send(right, chunk(OUTPUT, rank + 1 - step))
        b.recv(left, chunk(OUTPUT, rank - step))

    return b.build()


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
