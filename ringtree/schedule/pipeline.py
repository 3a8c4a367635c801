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

Scratch memory (but for buffers named ir.KEPT) shrinks to `window` segment-sized slots: each piece of data
written to scratch takes a free slot, and a write into a slot waits until the
slot's previous contents have been read. At most `window` pieces are in
scratch at once, and scratch is segment × window elements whatever the
message size; a schedule whose scratch names pools (ir.POOL) gets a window per
pool, so that pieces waiting on other ranks in one phase never hold the slots
another phase needs to go on. Which free slot a write takes decides how far
receives run ahead of the reductions that read them: `ahead` lets them
(lower.py says where).
"""

from __future__ import annotations

import heapq

from .ir import INPUT, KEPT, OUTPUT, POOL, Op, Ref, Schedule, ScheduleBuilder
from .order import dataflow

SLOTS = "slots"


def segmented(schedule: Schedule, segment: int, window: int = 4, ahead: bool = False) -> Schedule:
    """`ahead`: a write takes the least recently freed slot, not the most recently freed (_Slots)."""
    if segment < 1 or window < 1:
        raise ValueError(f"segment ({segment}) and window ({window}) must be positive")
    pieces, priorities = _split(schedule, segment)
    pools = _pools(pieces)
    order, slot_of = _pipeline_order(schedule, pieces, priorities, window, pools, ahead)

    b = ScheduleBuilder.like(schedule)
    for name, size in schedule.scratch:
        if name.startswith(KEPT):
            b.scratch(name, size)
    scratch_writes = [p.dst.count for p in pieces if p.dst is not None and _is_scratch(p.dst)]
    slots = b.scratch(SLOTS, max(scratch_writes) * window * len(pools)).buffer if scratch_writes else None
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
                    window: int, pools: list[str], ahead: bool) -> tuple[list[int], dict[tuple[int, Ref], int]]:
    """A sequential order of the pieces (a topological sort by priority) that runs segment by
    segment where dependencies allow and frees each scratch slot as soon as it can; and the slot
    each piece's scratch regions are in, keyed by (piece, region)."""
    b = ScheduleBuilder.like(schedule)
    for name, size in schedule.scratch:
        b.scratch(name, size)
    for piece in pieces:
        b.add(piece)
    graph = b.build()
    flow = dataflow(graph)
    slots = _Slots(schedule.rank, window, pools, pieces, graph, flow, ahead)
    pending = list(flow.initial_pending)
    ready = [(priorities[i], i) for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        if not slots.take(i, priorities[i], ready):
            continue
        order.append(i)
        slots.read(i, ready)
        for j in (*flow.dependents[i], flow.channel_next[i]):
            if j >= 0:
                pending[j] -= 1
                if pending[j] == 0:
                    heapq.heappush(ready, (priorities[j], j))
    if slots.waiting:
        raise ValueError(f"rank {schedule.rank}: a window of {window} scratch slots is too small for "
                         f"this schedule; use a larger window")
    return order, slots.slot_of


class _Slots:
    """Which scratch slot holds which piece's data, while _pipeline_order lists the pieces.

    A piece that puts new data into scratch waits for a free slot. One slot is kept for the
    earliest such piece in the original order (op by op, segment by segment), which never depends
    on a later piece; the others may go to any piece, in priority order. So pieces taken out of
    order can never hold every slot while the earliest one waits for their readers. A slot is free
    again once every piece that reads its data has been listed. A reduction into scratch data
    keeps its slot. The most recently freed slot is taken first, so that a receive into it follows
    the read of its last contents; with `ahead`, the least recently freed, so that a channel's
    receives are posted before the ones ahead of them are read (docs/design.md, "Pipelining").
    Each pool of scratch (ir.POOL) has slots of its own, `window` of them, and all of this holds
    within each: pool k's are slots k·window to (k + 1)·window - 1.
    """

    def __init__(self, rank: int, window: int, pools: list[str], pieces: list[Op], graph: Schedule, flow,
                 ahead: bool) -> None:
        self.rank, self.pieces, self.graph, self.window, self.ahead = rank, pieces, graph, window, ahead
        self.readers = [[j for j in flow.dependents[i] if piece.dst in pieces[j].srcs]
                        if piece.dst is not None and _is_scratch(piece.dst) else [] for i, piece in enumerate(pieces)]
        self.unread: dict[int, int] = {}  # scratch-writing piece -> readers not yet listed
        self.slot_of: dict[tuple[int, Ref], int] = {}
        self.pool_of = {name: k for k, name in enumerate(pools)}
        self.free = [list(range((k + 1) * window - 1, k * window - 1, -1)) for k in range(len(self.pool_of))]
        self.waiting: list[tuple[tuple, int]] = []  # pieces that need a slot while none is theirs
        # Per pool, the pieces that need a slot, in the original order; needing[k][earliest[k]] is
        # the first not yet given one.
        self.needing: list[list[int]] = [[] for _ in self.pool_of]
        for i, p in enumerate(pieces):
            if p.dst is not None and _is_scratch(p.dst) and p.dst not in p.srcs:
                self.needing[self._pool(p.dst)].append(i)
        self.given: set[int] = set()
        self.earliest = [0] * len(self.pool_of)

    def take(self, i: int, priority: tuple, ready: list) -> bool:
        """Give piece i a slot if it writes new data into scratch and may have one now; False (and
        piece i waits) if it may not."""
        piece = self.pieces[i]
        if piece.dst is None or not _is_scratch(piece.dst) or piece.dst in piece.srcs:
            return True
        k = self._pool(piece.dst)
        needing = self.needing[k]
        if len(self.free[k]) < (1 if needing[self.earliest[k]] == i else 2):
            self.waiting.append((priority, i))
            return False
        self.given.add(i)
        while self.earliest[k] < len(needing) and needing[self.earliest[k]] in self.given:
            self.earliest[k] += 1
        self._wake(ready)  # the new earliest may be among them
        return True

    def read(self, i: int, ready: list) -> None:
        """Piece i is listed: place its scratch regions, and free the slots whose data it read last."""
        piece = self.pieces[i]
        writes_scratch = piece.dst is not None and _is_scratch(piece.dst)
        accumulates = writes_scratch and piece.dst in piece.srcs
        for ref in piece.srcs:
            if _is_scratch(ref):
                w = self._writer_of(i, ref)
                self.slot_of[(i, ref)] = self.slot_of[(w, ref)]
                self.unread[w] -= 1
                if self.unread[w] == 0 and not (accumulates and ref == piece.dst):
                    self._release(self.slot_of[(w, ref)])
                    self._wake(ready)
        if writes_scratch:
            if not accumulates:
                self.slot_of[(i, piece.dst)] = self.free[self._pool(piece.dst)].pop()
            self.unread[i] = len(self.readers[i])
            if not self.readers[i]:
                self._release(self.slot_of[(i, piece.dst)])

    def _pool(self, ref: Ref) -> int:
        return self.pool_of[_pool_name(ref)]

    def _release(self, slot: int) -> None:
        """Free `slot`: its pool's free slots are taken from the end."""
        free = self.free[slot // self.window]
        if self.ahead:
            free.insert(0, slot)
        else:
            free.append(slot)

    def _wake(self, ready: list) -> None:
        for item in self.waiting:
            heapq.heappush(ready, item)
        self.waiting.clear()

    def _writer_of(self, j: int, ref: Ref) -> int:
        for d in self.graph.ops[j].deps:
            if self.pieces[d].dst == ref:
                return d
        raise ValueError(f"rank {self.rank}: {ref} is read without being written in whole; align the regions")


def _is_scratch(ref: Ref) -> bool:
    """Whether `ref` is in scratch that becomes slots (ir.KEPT buffers stay whole)."""
    return ref.buffer not in (INPUT, OUTPUT) and not ref.buffer.startswith(KEPT)


def _pool_name(ref: Ref) -> str:
    return ref.buffer.rpartition(POOL)[0]


def _pools(pieces: list[Op]) -> list[str]:
    """The pools of the scratch that becomes slots, in order of name ("": scratch named with none)."""
    return sorted({_pool_name(p.dst) for p in pieces if p.dst is not None and _is_scratch(p.dst)})


def _piece(ref: Ref, start: int, size: int) -> Ref:
    return Ref(ref.buffer, ref.offset + start, size)
