"""Check a collective's schedules for all ranks without MPI, by executing them on symbolic data.

Each rank's schedule is first checked statically: dependencies point backwards,
regions are in bounds, and no two ops that no chain of dependencies orders
touch the same element where one writes it (a race). Then every element of
every buffer holds a vector of counts: how many times each rank's input has
been added into it, and which element of the inputs it is (of the blocks laid
end to end, for an allgather). Ranks run together, with sends that complete
only once their receive is posted, so a schedule that could deadlock is
caught. They run twice: as the engine runs them (any op whose dependencies are
met), and as the stepwise path does (one step at a time, in listed order).
Each time, every rank's output must end up holding what its collective
promises (its entry's `promised`, schedule/collectives.py), in every element:
for an allreduce, every rank's input exactly once.

`replay` runs the same schedules on real values: the bits an allreduce of them computes, for a test
to compare with.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from ..algorithms.lower import Shape, lower
from ..schedule import INPUT, OUTPUT, OpKind, Schedule, dataflow, steps
from ..schedule.ir import ALLREDUCE, Collective


class ScheduleError(AssertionError):
    """A schedule that does not compute its collective, or could hang."""


def allreduce_schedules(algorithm: str, nranks: int, count: int, segment: int = 0, window: int = 4,
                        staged: bool = False, collective: Collective = ALLREDUCE) -> list[Schedule]:
    """Every rank's schedule, as lower() gives it to the engine (segment in elements)."""
    return [lower(Shape(algorithm, nranks, rank, count, segment, window, staged, False, collective)).schedule
            for rank in range(nranks)]


def verify(algorithm: str, nranks: int, count: int, segment: int = 0, window: int = 4, staged: bool = False,
           collective: Collective = ALLREDUCE) -> None:
    """Raise ScheduleError unless every rank's program for this shape computes its collective without
    deadlock, as the engine runs it and, unsegmented, as the stepwise path does."""
    verify_schedules(allreduce_schedules(algorithm, nranks, count, segment, window, staged, collective),
                     stepwise=not segment)


def verify_schedules(schedules: Sequence[Schedule], *, stepwise: bool = True) -> None:
    """Raise ScheduleError unless the schedules compute their collective without deadlock: as the engine
    runs them and, with `stepwise`, as the stepwise path does (which only takes unsegmented ones)."""
    nranks = len(schedules)
    for r, s in enumerate(schedules):
        if (s.rank, s.nranks) != (r, nranks):
            raise ScheduleError(f"schedule {r} claims to be rank {s.rank} of {s.nranks}")
        _check_deps(s)
        _check_races(s)
    _run_as_engine(schedules)
    if stepwise:
        _run_stepwise(schedules)


def replay(schedules: Sequence[Schedule], inputs: Sequence[np.ndarray], reduce) -> list[np.ndarray]:
    """Every rank's output of the schedules run on real values (`inputs`, a 1-D array per rank: its
    INPUT, or a broadcast's OUTPUT), with `reduce(left, right)` for each REDUCE, in its operand order:
    the result the schedules compute, bit for bit, as a reference for reductions that round
    (bfloat16, float16)."""
    ranks = [_ValueRank(s, len(schedules), data, reduce) for s, data in zip(schedules, inputs)]
    _run_ranks(ranks)
    return [rank.buffers[OUTPUT] for rank in ranks]


def _run_as_engine(schedules: Sequence[Schedule]) -> None:
    nranks = len(schedules)
    ranks = [_SymbolicRank(s, nranks) for s in schedules]
    _run_ranks(ranks)
    for rank in ranks:
        rank.check_result()


def _run_ranks(ranks) -> None:
    """Run the ranks together as the engine runs them (any op whose dependencies are met)."""
    channels = _Channels(ranks)
    while True:
        progressed = False
        for rank in ranks:
            for i in rank.post_ready():
                channels.post(rank, i)
                progressed = True
        if not channels.deliver() and not progressed:
            break

    stuck = [f"rank {r.rank} op {i} ({r.schedule.ops[i]})" for r in ranks for i in r.unfinished()]
    if stuck:
        raise ScheduleError("deadlock: these ops can never finish: " + "; ".join(stuck[:8]))


def _run_stepwise(schedules: Sequence[Schedule]) -> None:
    """Run each rank's steps in order; a step's messages complete once matched."""
    nranks = len(schedules)
    ranks = [_SymbolicRank(s, nranks) for s in schedules]
    rank_steps = [steps(s) for s in schedules]
    at = [0] * nranks  # each rank's current step
    posted_at = [-1] * nranks  # the step whose messages a rank has posted
    channels = _Channels(ranks)
    progressed = True
    while progressed:
        progressed = False
        for rank in ranks:
            r, ops = rank.rank, rank.schedule.ops
            while at[r] < len(rank_steps[r]):
                step = rank_steps[r][at[r]]
                if ops[step[0]].peer is None:
                    rank.compute(step[0])
                elif posted_at[r] != at[r]:
                    posted_at[r] = at[r]
                    for i in step:
                        channels.post(rank, i)
                    continue
                elif not all(rank.done[i] for i in step):
                    break
                at[r] += 1
                progressed = True
        progressed |= channels.deliver()

    stuck = [f"rank {r} step {at[r]} ({' and '.join(str(schedules[r].ops[i]) for i in rank_steps[r][at[r]])})"
             for r in range(nranks) if at[r] < len(rank_steps[r])]
    if stuck:
        raise ScheduleError("deadlock when run step by step: these ranks wait forever: " + "; ".join(stuck[:8]))
    for rank in ranks:
        rank.check_result()


def _check_deps(s: Schedule) -> None:
    sizes = s.buffer_sizes()
    for i, op in enumerate(s.ops):
        if any(not 0 <= d < i for d in op.deps):
            raise ScheduleError(f"rank {s.rank} op {i} ({op}) depends on a later op: {op.deps}")
        for ref in op.regions:
            if (ref.buffer not in sizes or ref.offset < 0 or ref.end > sizes[ref.buffer]):
                raise ScheduleError(f"rank {s.rank} op {i} ({op}) is out of bounds")


def _check_races(s: Schedule) -> None:
    """No two ops that no chain of dependencies orders may touch the same element where one of them
    writes it. Input counts as the part of the output it is when the call is in place."""
    before = []  # per op, a bitset of the ops that must finish before it starts
    for op in s.ops:
        mask = 0
        for d in op.deps:
            mask |= before[d] | (1 << d)
        before.append(mask)
    accesses: dict[str, list[tuple[int, int, int, bool]]] = {}
    for i, op in enumerate(s.ops):
        for ref, write in [(ref, False) for ref in op.srcs] + ([(op.dst, True)] if op.dst is not None else []):
            shift = s.input_at if ref.buffer == INPUT else None
            name = ref.buffer if shift is None else OUTPUT
            accesses.setdefault(name, []).append((ref.offset + (shift or 0), ref.end + (shift or 0), i, write))
    for name, items in accesses.items():
        items.sort()
        active: list[tuple[int, int, int, bool]] = []  # accesses that reach past the current offset
        for offset, end, i, write in items:
            active = [a for a in active if a[1] > offset]
            for other_offset, _, j, other_write in active:
                if (write or other_write) and i != j and not (before[i] >> j & 1 or before[j] >> i & 1):
                    first, second = sorted((i, j))
                    raise ScheduleError(
                        f"rank {s.rank}: op {first} ({s.ops[first]}) and op {second} ({s.ops[second]}) both touch "
                        f"{name}[{max(offset, other_offset)}], one writing it, with no dependency between them")
            active.append((offset, end, i, write))


class _Channels:
    """Messages posted and not yet matched, per (kind, sender, receiver): the k-th send from a to b
    matches the k-th receive at b from a, as MPI's non-overtaking rule makes it."""

    def __init__(self, ranks: list[_SymbolicRank]) -> None:
        self.ranks = ranks
        self.posted: dict[tuple[OpKind, int, int], deque[int]] = {}

    def post(self, rank: _SymbolicRank, i: int) -> None:
        op = rank.schedule.ops[i]
        sender, receiver = (rank.rank, op.peer) if op.kind is OpKind.SEND else (op.peer, rank.rank)
        self.posted.setdefault((op.kind, sender, receiver), deque()).append(i)

    def deliver(self) -> bool:
        """Match every posted send with its receive; say whether any was."""
        delivered = False
        for (kind, sender, receiver), sends in self.posted.items():
            recvs = self.posted.get((OpKind.RECV, sender, receiver)) if kind is OpKind.SEND else None
            while sends and recvs:
                _deliver(self.ranks[sender], sends.popleft(), self.ranks[receiver], recvs.popleft())
                delivered = True
        return delivered


def _deliver(sender: _SymbolicRank, si: int, receiver: _SymbolicRank, ri: int) -> None:
    send, recv = sender.schedule.ops[si], receiver.schedule.ops[ri]
    if send.src.count != recv.dst.count:
        raise ScheduleError(
            f"rank {sender.rank} op {si} sends {send.src.count} elements but rank {receiver.rank} "
            f"op {ri} receives {recv.dst.count}")
    receiver.write(recv.dst, sender.read(send.src, si), ri)
    sender.finish(si)
    receiver.finish(ri)


class _SymbolicRank:
    """A rank whose elements hold, per rank, how many times its input was added in, and in a last
    column which element of the inputs they are (-1: elements of different places added)."""

    def __init__(self, schedule: Schedule, nranks: int) -> None:
        self.schedule, self.rank, self.nranks = schedule, schedule.rank, nranks
        self.buffers = {name: np.zeros((size, nranks + 1), np.int64) for name, size in schedule.buffer_sizes().items()}
        self.defined = {name: np.zeros(size, bool) for name, size in schedule.buffer_sizes().items()}
        collective = schedule.collective
        start, given = collective.kind.first_input(collective, self.rank), collective.kind.given
        if given == INPUT or self.rank == schedule.collective.root:
            self.buffers[given][:, self.rank] = 1
            self.buffers[given][:, -1] = start + np.arange(len(self.buffers[given]))
            self.defined[given][:] = True
        self.done = [False] * len(schedule.ops)
        flow = dataflow(schedule)  # as the engine: deps, and channel order for messages
        self.pending = list(flow.initial_pending)
        self.dependents, self.channel_next = flow.dependents, flow.channel_next
        self.ready = [i for i, p in enumerate(self.pending) if p == 0]

    def post_ready(self) -> list[int]:
        """Run every ready local op; return the messages that became ready to post."""
        new_messages = []
        while self.ready:
            i = self.ready.pop()
            if self.schedule.ops[i].peer is None:
                self.compute(i)
            else:
                new_messages.append(i)
                self._release(self.channel_next[i])
        return new_messages

    def compute(self, i: int) -> None:
        op = self.schedule.ops[i]
        if op.kind is OpKind.COPY:
            self.write(op.dst, self.read(op.src, i), i)
        else:
            left, right = op.srcs
            self.write(op.dst, self.combine(self.read(left, i), self.read(right, i)), i)
        self.finish(i)

    @staticmethod
    def combine(left, right):
        total = left + right  # contributions counted
        total[:, -1] = np.where(left[:, -1] == right[:, -1], left[:, -1], -1)
        return total

    def _release(self, i: int) -> None:
        if i >= 0:
            self.pending[i] -= 1
            if self.pending[i] == 0:
                self.ready.append(i)

    def read(self, ref, i):
        if not self.defined[ref.buffer][ref.offset:ref.end].all():
            first = ref.offset + int(np.argmin(self.defined[ref.buffer][ref.offset:ref.end]))
            raise ScheduleError(
                f"rank {self.rank} op {i} ({self.schedule.ops[i]}) reads {ref.buffer}[{first}] before anything was written there")
        return self.buffers[ref.buffer][ref.offset:ref.end].copy()

    def write(self, ref, values, i):
        if ref.buffer == INPUT:
            raise ScheduleError(f"rank {self.rank} op {i} ({self.schedule.ops[i]}) writes the input")
        self.buffers[ref.buffer][ref.offset:ref.end] = values
        self.defined[ref.buffer][ref.offset:ref.end] = True

    def finish(self, i):
        self.done[i] = True
        for d in self.dependents[i]:
            self._release(d)

    def unfinished(self):
        return [i for i, d in enumerate(self.done) if not d]

    def check_result(self):
        out, expected = self.buffers[OUTPUT], _promised(self.schedule)
        wrong = np.flatnonzero(~self.defined[OUTPUT] | (out != expected).any(axis=1))
        if wrong.size:
            e = int(wrong[0])
            held = ({r: int(c) for r, c in enumerate(out[e, :-1]) if c} if self.defined[OUTPUT][e] else "nothing")
            owners = np.flatnonzero(expected[e, :-1])
            want = "every rank's input once" if len(owners) > 1 else f"rank {owners[0]}'s input once"
            origin = "different input elements added" if out[e, -1] < 0 else f"input element {out[e, -1]}"
            where = ("" if not self.defined[OUTPUT][e] or out[e, -1] == expected[e, -1]
                     else f", of {origin} where element {expected[e, -1]} belongs")
            raise ScheduleError(
                f"rank {self.rank}: output[{e}] holds contributions {held} (rank: times){where}, "
                f"not {want} ({wrong.size} wrong elements)")


def _promised(schedule: Schedule) -> np.ndarray:
    """What each element of a rank's OUTPUT must hold at the end, as _SymbolicRank counts it: its
    collective's promise (schedule/collectives.py)."""
    collective, nranks = schedule.collective, schedule.nranks
    size = schedule.buffer_sizes()[OUTPUT]
    expected = np.zeros((size, nranks + 1), np.int64)
    for offset, block, source, first in collective.kind.promised(collective, schedule.rank, size):
        expected[offset:offset + block, slice(nranks) if source is None else source] = 1
        expected[offset:offset + block, -1] = first + np.arange(block)
    return expected


class _ValueRank(_SymbolicRank):
    """A rank whose buffers hold values, not counts of contributions (replay)."""

    def __init__(self, schedule: Schedule, nranks: int, data: np.ndarray, reduce) -> None:
        super().__init__(schedule, nranks)
        self.buffers = {name: np.zeros(size, data.dtype) for name, size in schedule.buffer_sizes().items()}
        given = schedule.collective.kind.given
        if given == INPUT or self.rank == schedule.collective.root:
            self.buffers[given][:] = data
        self.combine = reduce
