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

Scratch memory shrinks to `window` segment-sized slots: each piece of data
written to scratch takes a free slot, and a write into a slot waits until the
slot's previous contents have been read. At most `window` pieces are in
scratch at once, and scratch is segment × window elements whatever the
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
    order, slot_of = _pipeline_order(schedule, pieces, priorities, window)

    b = ScheduleBuilder(schedule.algorithm, schedule.nranks, schedule.rank, schedule.count)
    scratch_writes = [p.dst.count for p in pieces if p.dst is not None and _is_scratch(p.dst)]
    slots = b.scratch(SLOTS, max(scratch_writes) * window).buffer if scratch_writes else None
    size = max(scratch_writes, default=0)
    for i in order:
        piece = pieces[i]

        def placed(ref: Ref, slot: int) -> Ref:
            return Ref(slots, slot * size, ref.count)

        srcs = tuple(placed(ref, slot_of[(i, ref)]) if _is_scratch(ref) else ref for ref in piece.srcs)
        dst = piece.dst
        if dst is not None and _is_scratch(dst):
            dst = placed(dst, slot_of[(i, dst)])
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


def _pipeline_order(schedule: Schedule, pieces: list[Op], priorities: list[tuple[bool, int, int]],
                    window: int) -> tuple[list[int], dict[tuple[int, Ref], int]]:
    """A sequential order of the pieces (a topological sort by priority) that runs segment by
    segment where dependencies allow and frees each scratch slot as soon as it can; and the slot
    each piece's scratch regions are in, keyed by (piece, region).

    A piece that puts new data into scratch waits for a free slot. One slot is kept for the
    earliest such piece in the original order (op by op, segment by segment), which never depends
    on a later piece; the others may go to any piece, in priority order. So pieces taken out of
    order can never hold every slot while the earliest one waits for their readers. A slot is free
    again once every piece that reads its data has been listed. A reduction into scratch data
    keeps its slot.
    """
    b = ScheduleBuilder(schedule.algorithm, schedule.nranks, schedule.rank, schedule.count)
    for name, size in schedule.scratch:
        b.scratch(name, size)
    for piece in pieces:
        b.add(piece)
    graph = b.build()
    flow = dataflow(graph)

    def writer_of(j: int, ref: Ref) -> int:
        for d in graph.ops[j].deps:
            if pieces[d].dst == ref:
                return d
        raise ValueError(f"rank {schedule.rank}: {ref} is read without being written in whole; "
                         "align the regions")

    readers = [[j for j in flow.dependents[i] if pieces[i].dst in pieces[j].srcs]
               if pieces[i].dst is not None and _is_scratch(pieces[i].dst) else [] for i in range(len(pieces))]
    unread: dict[int, int] = {}  # scratch-writing piece -> readers not yet listed
    slot_of: dict[tuple[int, Ref], int] = {}
    # The most recently freed slot is taken first, so a receive into it follows the read of its
    # last contents: one receive at a time per channel, with every send already posted. On a 2-core
    # VM this ran a 2-rank 64 MiB ring in 22-24 ms against 26-30 ms for taking the least recently
    # freed slot (receives posted ahead into other slots), three runs each.
    free_slots = list(range(window - 1, -1, -1))
    waiting: list[tuple[tuple, int]] = []  # pieces that need a slot while none is free, or not yet theirs
    # Pieces that need a slot, in the original order; earliest[0] indexes the first not yet given one.
    needing = [i for i, p in enumerate(pieces) if p.dst is not None and _is_scratch(p.dst) and p.dst not in p.srcs]
    given: set[int] = set()
    earliest = 0

    pending = list(flow.initial_pending)
    ready = [(priorities[i], i) for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        piece = pieces[i]
        writes_scratch = piece.dst is not None and _is_scratch(piece.dst)
        accumulates = writes_scratch and piece.dst in piece.srcs
        if writes_scratch and not accumulates:
            if len(free_slots) < (1 if needing[earliest] == i else 2):
                waiting.append((priorities[i], i))
                continue
            given.add(i)
            while earliest < len(needing) and needing[earliest] in given:
                earliest += 1
            for item in waiting:  # the new earliest may be among them
                heapq.heappush(ready, item)
            waiting.clear()
        order.append(i)
        for ref in piece.srcs:
            if _is_scratch(ref):
                w = writer_of(i, ref)
                slot_of[(i, ref)] = slot_of[(w, ref)]
                unread[w] -= 1
                if unread[w] == 0 and not (accumulates and ref == piece.dst):
                    free_slots.append(slot_of[(w, ref)])
                    for item in waiting:
                        heapq.heappush(ready, item)
                    waiting.clear()
        if writes_scratch:
            slot_of[(i, piece.dst)] = slot_of[(i, piece.dst)] if accumulates else free_slots.pop()
            unread[i] = len(readers[i])
            if not readers[i]:
                free_slots.append(slot_of[(i, piece.dst)])
        for j in (*flow.dependents[i], flow.channel_next[i]):
            if j >= 0:
                pending[j] -= 1
                if pending[j] == 0:
                    heapq.heappush(ready, (priorities[j], j))
    if waiting:
        raise ValueError(f"rank {schedule.rank}: a window of {window} scratch slots is too small for "
                         f"this schedule; use a larger window")
    return order, slot_of


def _is_scratch(ref: Ref) -> bool:
    return ref.buffer not in (INPUT, OUTPUT)


def _piece(ref: Ref, start: int, size: int) -> Ref:
    return Ref(ref.buffer, ref.offset + start, size)
