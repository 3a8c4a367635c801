"""Pipelining as a schedule transformation: split every op into segments.

An op on c elements becomes ⌈c/segment⌉ ops on consecutive pieces of its
regions. Dependencies are derived piece by piece from the regions they touch,
so they map segment to segment: segment k of a reduction waits for segment k of
its receive, not for the whole message.

The pieces are listed segment by segment (the order a pipeline runs them in),
except that messages on each channel (same kind, same peer) stay in the order
of the original ops and, within one op, of their segments. Every rank splits a
message the same way, so the k-th send on a channel still matches the k-th
receive.

Scratch memory shrinks to a ring of `window` segment-sized slots: each piece of
data written to scratch takes the next slot, and a write into a slot waits
until the slot's previous contents have been read. At most `window` pieces are
in flight into scratch, and scratch is segment × window elements whatever the
message size.
"""

from __future__ import annotations

import heapq

from .schedule import INPUT, OUTPUT, Op, Ref, Schedule, ScheduleBuilder, dataflow

SLOTS = "slots"


def segmented(schedule: Schedule, segment: int, window: int = 4) -> Schedule:
    if segment < 1 or window < 1:
        raise ValueError(f"segment ({segment}) and window ({window}) must be positive")
    pieces, priorities = _split(schedule, segment)
    order = _pipeline_order(schedule, pieces, priorities)

    b = ScheduleBuilder(schedule.algorithm, schedule.nranks, schedule.rank, schedule.count)
    scratch_writes = [p.dst.count for p in pieces if p.dst is not None and _is_scratch(p.dst)]
    slots = _Slots(b, max(scratch_writes), window, schedule.rank) if scratch_writes else None
    for i in order:
        piece = pieces[i]
        srcs, dst = piece.srcs, piece.dst
        if slots is not None:
            accumulates = dst in srcs  # a reduction into scratch data keeps its slot
            srcs = tuple(slots.holding(ref) if _is_scratch(ref) else ref for ref in srcs)
            if dst is not None and _is_scratch(dst):
                dst = slots.holding(dst) if accumulates else slots.take(dst)
        b.add(Op(piece.kind, dst, srcs, piece.peer))
    return b.build()


def _split(schedule: Schedule, segment: int) -> tuple[list[Op], list[tuple[bool, int, int]]]:
    """The pieces of every op, op by op, and the priority of each: pieces that read scratch
    first (they free a slot), then by segment index, then by op index."""
    pieces, priorities = [], []
    for index, op in enumerate(schedule.ops):
        count = op.regions[0].count
        for k, start in enumerate(range(0, count, segment)):
            size = min(segment, count - start)
            dst = _piece(op.dst, start, size) if op.dst is not None else None
            srcs = tuple(_piece(ref, start, size) for ref in op.srcs)
            pieces.append(Op(op.kind, dst, srcs, op.peer))
            priorities.append((not any(map(_is_scratch, srcs)), k, index))
    return pieces, priorities


def _pipeline_order(schedule: Schedule, pieces: list[Op], priorities: list[tuple[bool, int, int]]) -> list[int]:
    """A sequential order of the pieces (a topological sort by priority) that runs segment by
    segment where dependencies allow and frees each scratch slot as soon as it can."""
    b = ScheduleBuilder(schedule.algorithm, schedule.nranks, schedule.rank, schedule.count)
    for name, size in schedule.scratch:
        b.scratch(name, size)
    for piece in pieces:
        b.add(piece)
    flow = dataflow(b.build())
    # Emitting a piece is posting it: it releases its dependents and the next piece on its channel.
    pending = list(flow.initial_pending)
    ready = [(priorities[i], i) for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in (*flow.dependents[i], flow.channel_next[i]):
            if j >= 0:
                pending[j] -= 1
                if pending[j] == 0:
                    heapq.heappush(ready, (priorities[j], j))
    return order


def _is_scratch(ref: Ref) -> bool:
    return ref.buffer not in (INPUT, OUTPUT)


def _piece(ref: Ref, start: int, size: int) -> Ref:
    return Ref(ref.buffer, ref.offset + start, size)


class _Slots:
    """Which slot holds each piece of scratch data, handed out round-robin."""

    def __init__(self, builder: ScheduleBuilder, size: int, window: int, rank: int) -> None:
        self.buffer = builder.scratch(SLOTS, size * window).buffer
        self.size, self.window, self.rank = size, window, rank
        self.where: dict[Ref, int] = {}
        self.owner: list[Ref | None] = [None] * window
        self.taken = 0

    def take(self, piece: Ref) -> Ref:
        slot = self.taken % self.window
        self.taken += 1
        self.owner[slot] = piece
        self.where[piece] = slot
        return self._ref(slot, piece)

    def holding(self, piece: Ref) -> Ref:
        slot = self.where.get(piece)
        if slot is None or self.owner[slot] != piece:
            raise ValueError(f"rank {self.rank}: {piece} is read after its slot was reused or without being "
                             f"written in whole; use a larger window than {self.window} or align the regions")
        return self._ref(slot, piece)

    def _ref(self, slot: int, piece: Ref) -> Ref:
        return Ref(self.buffer, slot * self.size, piece.count)
