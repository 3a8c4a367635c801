"""Alltoall: rank r's block d goes to rank d, where it is block r; blocks alike, or of a matrix of counts.

pairwise  N-1 steps: in step k a rank sends its block for rank r+k and receives rank r-k's block
          for it (with N a power of two, the partners r XOR k exchange). One message per peer, each
          sent straight from the input to its place: N-1 messages of one block. Blocks of any sizes.
bruck     ⌈log2 N⌉ rounds for any N: the blocks turned so that position i holds the one for rank
          r+i; in round k every position with bit k set moves k ranks on, packed into one message;
          at the end position i holds rank r-i's block for this rank. log2 N messages of up to N/2
          blocks each, for a copy of every block per round: the better for small blocks. Blocks alike
          only: a rank forwards blocks of others, whose sizes a matrix gives only the ranks it concerns.
"""

from __future__ import annotations

from ..schedule.ir import INPUT, KEPT, OUTPUT, Collective, Ref, Schedule, ScheduleBuilder, single_rank


def pairwise_alltoall(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("pairwise", count, collective)
    b = ScheduleBuilder("pairwise", nranks, rank, count, collective)
    sent, received = collective.exchanged(rank)
    b.copy(Ref(OUTPUT, *received[rank]), Ref(INPUT, *sent[rank]))
    exchanges = nranks & (nranks - 1) == 0
    receive_first = False
    for step in range(1, nranks):
        to, source = (rank ^ step, rank ^ step) if exchanges else ((rank + step) % nranks, (rank - step) % nranks)
        send, recv = Ref(INPUT, *sent[to]), Ref(OUTPUT, *received[source])
        # A step of one message (the other block empty) starts the next step with the same kind, so that
        # the stepwise runner does not pair messages of two steps (schedule.order.steps).
        if receive_first:
            b.recv(source, recv)
            b.send(to, send)
        else:
            b.send(to, send)
            b.recv(source, recv)
        if not (send.count and recv.count) and (send.count or recv.count):
            receive_first = bool(recv.count)
    return b.build()


def bruck_alltoall(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("bruck", count, collective)
    if not collective.alike():
        raise ValueError("bruck: an alltoall of blocks alike only; pairwise takes a matrix of counts")
    b = ScheduleBuilder("bruck", nranks, rank, count, collective)
    size = collective.counts[0]
    rounds = [1 << k for k in range((nranks - 1).bit_length())]
    moving = {k: [i for i in range(nranks) if i & k] for k in rounds}  # the positions each round moves
    # Kept whole when segmented: blocks are packed and unpacked in runs other than the ones written.
    turned = b.scratch(KEPT + "turned", count)
    most = max(len(positions) for positions in moving.values()) * size
    packed, unpacked = b.scratch(KEPT + "packed", most), b.scratch(KEPT + "unpacked", most)

    def at(buffer: Ref, position: int, blocks: int = 1) -> Ref:
        return Ref(buffer.buffer, buffer.offset + position * size, blocks * size)

    ahead = nranks - rank  # turn: position i holds the block for rank + i
    b.copy(at(turned, 0, ahead), Ref(INPUT, rank * size, ahead * size))
    if rank:
        b.copy(at(turned, ahead, rank), Ref(INPUT, 0, rank * size))
    for k in rounds:
        runs = _runs(moving[k])
        for offset, (first, length) in zip(_offsets(runs), runs):
            b.copy(at(packed, offset, length), at(turned, first, length))
        blocks = len(moving[k])
        b.send((rank + k) % nranks, at(packed, 0, blocks))
        b.recv((rank - k) % nranks, at(unpacked, 0, blocks))
        for offset, (first, length) in zip(_offsets(runs), runs):
            b.copy(at(turned, first, length), at(unpacked, offset, length))
    for position in range(nranks):  # position i holds rank r-i's block
        b.copy(Ref(OUTPUT, (rank - position) % nranks * size, size), at(turned, position))
    return b.build()


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """(first, length) of each run of consecutive positions."""
    runs: list[tuple[int, int]] = []
    for position in positions:
        if runs and runs[-1][0] + runs[-1][1] == position:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((position, 1))
    return runs


def _offsets(runs: list[tuple[int, int]]) -> list[int]:
    """Where each run starts in the packed message, in blocks."""
    offsets, at = [], 0
    for _, length in runs:
        offsets.append(at)
        at += length
    return offsets
