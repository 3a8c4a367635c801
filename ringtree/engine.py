"""The progress engine: runs one rank's schedule on real buffers with nonblocking MPI.

Each op waits for a count of unfinished dependencies. An op whose count reaches
zero is issued at once: sends and receives are posted as Isend/Irecv, reductions
and copies run immediately. Messages to (and from) the same peer are posted in
schedule order, which is what lets the schedule rely on MPI's non-overtaking
rule. All collectives in flight share one list of requests, so waiting on any
of them progresses every one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from mpi4py import MPI

from .algorithms import ALGORITHMS
from .schedule import INPUT, OUTPUT, OpKind, Schedule

_SEND, _RECV, _REDUCE, _COPY = OpKind.SEND, OpKind.RECV, OpKind.REDUCE, OpKind.COPY


@dataclass(frozen=True, slots=True)
class CompiledSchedule:
    """A schedule in the form the engine walks: flat tuples indexed by op."""

    schedule: Schedule
    dependents: tuple[tuple[int, ...], ...]  # ops whose deps include this one
    channel_next: tuple[int, ...]  # next message op on the same (kind, peer), or -1
    initial_pending: tuple[int, ...]  # deps, plus one for an earlier message on the same channel


def compile_schedule(schedule: Schedule) -> CompiledSchedule:
    n = len(schedule.ops)
    dependents: list[list[int]] = [[] for _ in range(n)]
    channel_next = [-1] * n
    pending = [len(op.deps) for op in schedule.ops]
    last_on_channel: dict[tuple[OpKind, int], int] = {}
    for i, op in enumerate(schedule.ops):
        for d in op.deps:
            dependents[d].append(i)
        if op.peer is not None:
            prev = last_on_channel.get((op.kind, op.peer))
            if prev is not None:
                channel_next[prev] = i
                pending[i] += 1
            last_on_channel[(op.kind, op.peer)] = i
    return CompiledSchedule(schedule, tuple(map(tuple, dependents)), tuple(channel_next), tuple(pending))


@lru_cache(maxsize=512)
def compiled(algorithm: str, nranks: int, rank: int, count: int) -> CompiledSchedule:
    return compile_schedule(ALGORITHMS[algorithm](nranks, rank, count))


class Execution:
    """One rank's run of one collective."""

    def __init__(self, plan: CompiledSchedule, buffers: dict, backend, reduce, comm: MPI.Comm, tag: int,
                 finish) -> None:
        self.plan = plan
        self.buffers = buffers
        self.backend = backend
        self.reduce = reduce
        self.comm = comm
        self.tag = tag
        self.finish = finish
        self.inplace = backend.same_memory(buffers[INPUT], buffers[OUTPUT]) if plan.schedule.count else False
        self.pending = list(plan.initial_pending)
        self.remaining = len(plan.schedule.ops)
        self.done = False
        self._issue([i for i, p in enumerate(self.pending) if p == 0])
        if self.remaining == 0:
            self._complete()
        else:
            PROGRESS.executions.add(self)

    def _view(self, ref):
        return self.buffers[ref.buffer][ref.offset:ref.end]

    def _issue(self, ready: list[int]) -> None:
        ops = self.plan.schedule.ops
        while ready:
            i = ready.pop()
            op = ops[i]
            kind = op.kind
            if kind is _REDUCE:
                self.reduce(self._view(op.dst), self._view(op.src))
                self._finished(i, ready)
            elif kind is _COPY:
                if not (self.inplace and op.src.buffer == INPUT and op.src.offset == op.dst.offset
                        and op.dst.buffer == OUTPUT):
                    self.backend.copy(self._view(op.dst), self._view(op.src))
                self._finished(i, ready)
            else:
                if kind is _SEND:
                    request = self.comm.Isend([self._view(op.src), MPI.BYTE], op.peer, self.tag)
                else:
                    request = self.comm.Irecv([self._view(op.dst), MPI.BYTE], op.peer, self.tag)
                PROGRESS.add(request, self, i)
                following = self.plan.channel_next[i]
                if following >= 0:
                    self.pending[following] -= 1
                    if self.pending[following] == 0:
                        ready.append(following)

    def _finished(self, i: int, ready: list[int]) -> None:
        self.remaining -= 1
        pending = self.pending
        for d in self.plan.dependents[i]:
            pending[d] -= 1
            if pending[d] == 0:
                ready.append(d)

    def message_done(self, i: int) -> None:
        ready: list[int] = []
        self._finished(i, ready)
        self._issue(ready)
        if self.remaining == 0:
            self._complete()

    def _complete(self) -> None:
        self.done = True
        PROGRESS.executions.discard(self)
        self.finish()


class Progress:
    """Every request in flight in this process, with the op it belongs to."""

    def __init__(self) -> None:
        self.requests: list[MPI.Request] = []
        self.owners: list[tuple[Execution, int]] = []
        self.executions: set[Execution] = set()

    def add(self, request: MPI.Request, execution: Execution, op: int) -> None:
        self.requests.append(request)
        self.owners.append((execution, op))

    def poll(self, block: bool) -> None:
        """Handle the requests that completed; with `block`, wait until at least one has."""
        if not self.requests:
            return
        finished = MPI.Request.Waitsome(self.requests) if block else MPI.Request.Testsome(self.requests)
        if not finished:
            return
        owners = [self.owners[i] for i in finished]
        keep = sorted(set(range(len(self.requests))) - set(finished))
        self.requests = [self.requests[i] for i in keep]
        self.owners = [self.owners[i] for i in keep]
        for execution, op in owners:
            execution.message_done(op)

    def wait(self, execution: Execution) -> None:
        while not execution.done:
            if not self.requests:
                raise RuntimeError("ringtree engine: a collective has ops left but no message in flight")
            self.poll(block=True)


PROGRESS = Progress()
