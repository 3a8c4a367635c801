"""The progress engine: runs one rank's schedule on real buffers with nonblocking MPI.

Each op waits for a count of unfinished dependencies. An op whose count reaches
zero is issued: sends and receives are posted as Isend/Irecv at once, and
reductions and copies run after every message that is ready has been posted,
so transfers are already under way while the array library computes. Messages
to (and from) the same peer are posted in schedule order, which is what lets
the schedule rely on MPI's non-overtaking rule. All collectives in flight share
one list of requests, so waiting on any of them progresses every one.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from mpi4py import MPI

from . import reliability, timeline
from .errors import MismatchError, PeerFailure
from .algorithms import ALGORITHMS
from .pipeline import segmented
from .schedule import INPUT, OUTPUT, OpKind, Schedule, blocking_steps, dataflow
from .staging import staged


@dataclass(frozen=True, slots=True)
class CompiledSchedule:
    """A schedule in the form the engine walks: flat tuples indexed by op.

    Buffers are numbered: 0 input, 1 output, then the scratch buffers in the
    order the schedule declares them.
    """

    schedule: Schedule
    dependents: tuple[tuple[int, ...], ...]  # ops whose deps include this one
    channel_next: tuple[int, ...]  # next message op on the same (kind, peer), or -1
    initial_pending: tuple[int, ...]  # deps, plus one for an earlier message on the same channel
    first_ready: tuple[int, ...]  # ops with nothing to wait for
    # Per op: ("send" | "recv", peer, buffer, element slice) for messages;
    # ("reduce", dst, left, right) or ("copy", dst, src) with (buffer, element slice) regions for the rest;
    # None for a copy of the input onto itself when the call is in place.
    actions: tuple[tuple, ...]
    in_place_actions: tuple[tuple | None, ...]
    # For run_blocking, unsegmented schedules only (else None): one entry per blocking step,
    # ("sendrecv", peer, region, peer, region), ("send" | "recv", peer, region), or a compute action as above;
    # a region is (buffer, element slice or None for all of it).
    program: tuple[tuple, ...] | None
    in_place_program: tuple[tuple, ...] | None


def compile_schedule(schedule: Schedule, blocking: bool = False) -> CompiledSchedule:
    """The schedule as the engine walks it; with `blocking`, also as run_blocking does."""
    flow = dataflow(schedule)
    number = {INPUT: 0, OUTPUT: 1, **{name: 2 + k for k, (name, _) in enumerate(schedule.scratch)}}
    sizes = schedule.buffer_sizes()

    def elements(ref):
        return number[ref.buffer], slice(ref.offset, ref.end)

    def region(ref):
        whole = ref.offset == 0 and ref.count == sizes[ref.buffer]
        return number[ref.buffer], None if whole else slice(ref.offset, ref.end)

    actions = []
    for op in schedule.ops:
        if op.peer is not None:
            ref = op.src if op.kind is OpKind.SEND else op.dst
            actions.append((op.kind.value, op.peer, *elements(ref)))
        else:
            actions.append((op.kind.value, elements(op.dst), *map(elements, op.srcs)))
    in_place = [None if op.kind is OpKind.COPY and op.src.buffer == INPUT and op.dst.buffer == OUTPUT
                and op.src.offset == op.dst.offset else action for op, action in zip(schedule.ops, actions)]

    def program(inplace):
        steps = []
        for step in blocking_steps(schedule):
            ops = [schedule.ops[i] for i in step]
            if len(step) == 2:
                send, recv = ops if ops[0].kind is OpKind.SEND else ops[::-1]
                steps.append(("sendrecv", send.peer, region(send.src), recv.peer, region(recv.dst)))
            elif ops[0].peer is not None:
                steps.append((ops[0].kind.value, ops[0].peer, region(ops[0].regions[0])))
            elif not (inplace and in_place[step[0]] is None):
                steps.append((ops[0].kind.value, region(ops[0].dst), *map(region, ops[0].srcs)))
        return tuple(steps)

    return CompiledSchedule(schedule, flow.dependents, flow.channel_next, flow.initial_pending,
                            tuple(i for i, p in enumerate(flow.initial_pending) if p == 0), tuple(actions),
                            tuple(in_place), program(False) if blocking else None,
                            program(True) if blocking else None)


@lru_cache(maxsize=256)
def compiled(algorithm: str, nranks: int, rank: int, count: int, segment: int = 0,
             window: int = 4, staging: bool = False) -> CompiledSchedule:
    """The schedule to run, built once per shape. `segment` in elements; 0 means no segmenting.
    `staging`: messages go through host slots (staging.py), for device buffers an MPI cannot take."""
    schedule = ALGORITHMS[algorithm](nranks, rank, count)
    if segment:
        schedule = segmented(schedule, segment, window)
    if staging:
        schedule = staged(schedule, window)
    return compile_schedule(schedule, blocking=not segment)


def run_blocking(program: tuple[tuple, ...], buffers: list, reduce, copy, comm: MPI.Comm, tag: int) -> None:
    """Run a compiled program to the end, blocking on each step: the lean path for small and mid-sized
    messages.

    Only for when no other collective is in flight in this process, since it
    progresses nothing else. Messages go as bytes: [region, MPI.BYTE]; a
    message of another size than its receive raises MismatchError.
    """
    status = _STATUS
    try:
        for step in program:
            kind = step[0]
            if kind == "sendrecv":
                _, to, (s, ss), source, (r, rs) = step
                into = buffers[r] if rs is None else buffers[r][rs]
                comm.Sendrecv([buffers[s] if ss is None else buffers[s][ss], BYTE], to, tag, [into, BYTE], source, tag,
                              status)
                if status.Get_count(BYTE) != into.nbytes:
                    raise _wrong_size(comm, source, status.Get_count(BYTE), into.nbytes)
            elif kind == "reduce":
                (d, ds), (l, ls), (r, rs) = step[1:]
                reduce(buffers[l] if ls is None else buffers[l][ls], buffers[r] if rs is None else buffers[r][rs],
                       buffers[d] if ds is None else buffers[d][ds])
            elif kind == "copy":
                (d, ds), (s, ss) = step[1:]
                copy(buffers[d] if ds is None else buffers[d][ds], buffers[s] if ss is None else buffers[s][ss])
            else:
                _, peer, (b, bs) = step
                region = buffers[b] if bs is None else buffers[b][bs]
                if kind == "send":
                    comm.Send([region, BYTE], peer, tag)
                else:
                    comm.Recv([region, BYTE], peer, tag, status)
                    if status.Get_count(BYTE) != region.nbytes:
                        raise _wrong_size(comm, peer, status.Get_count(BYTE), region.nbytes)
    except MPI.Exception as error:
        translated = _translated(_error_classes(error, [status]), comm)
        if translated is None:
            raise
        raise translated from None


_STATUS = MPI.Status()  # run_blocking's, reused: ringtree is called from one thread at a time (docs/design.md)


def _wrong_size(comm, peer: int, got: int, expected: int) -> MismatchError:
    return MismatchError(f"ringtree allreduce on rank {comm.Get_rank()}: a message from rank {peer} has {got} bytes "
                         f"where this rank expects {expected}: the ranks disagree on the count, dtype or algorithm; "
                         "check=True (RINGTREE_CHECK=1) names them")


_PEER_FAILED = (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)


def _error_classes(error: MPI.Exception, statuses: list) -> list[int]:
    """The error's class, and for MPI_ERR_IN_STATUS those of the statuses, in order."""
    if error.Get_error_class() != MPI.ERR_IN_STATUS:
        return [error.Get_error_class()]
    return [MPI.Get_error_class(status.Get_error()) for status in statuses]


def _translated(classes: list[int], comm) -> Exception | None:
    """ringtree's error for MPI error classes it understands: a message larger than its receive, or
    a failed peer; None for any other."""
    if MPI.ERR_TRUNCATE in classes:
        return _did_not_fit(comm)
    if any(c in _PEER_FAILED for c in classes):
        return _peer_failure(comm)
    return None


def _peer_failure(comm) -> PeerFailure:
    """Which ranks failed, as far as this rank knows; and revoke ringtree's communicator, so that the
    survivors still waiting on it stop too, and raise this as well."""
    try:
        group = comm.Get_failed()
        failed = list(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), comm.Get_group()))
        group.Free()
    except MPI.Exception:
        failed = []
    try:
        comm.Revoke()
    except MPI.Exception:
        pass
    return PeerFailure(f"ringtree allreduce on rank {comm.Get_rank()}: "
                       + (f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} failed" if failed
                          else "a rank failed (the MPI did not say which)")
                       + "; the communicator can be shrunk to the survivors (comm.Shrink()) to go on", failed)


def _did_not_fit(comm) -> MismatchError:
    return MismatchError(f"ringtree allreduce on rank {comm.Get_rank()}: a message was larger than its receive: "
                         "the ranks disagree on the count, dtype or algorithm; check=True (RINGTREE_CHECK=1) names them")


BYTE = MPI.BYTE


class Execution:
    """One rank's run of one collective."""

    __slots__ = ("plan", "actions", "buffers", "reduce", "copy", "asynchronous", "state", "comm", "seq", "tag",
                 "finish", "timeout", "pending", "remaining", "done", "computes")

    def __init__(self, plan: CompiledSchedule, buffers: list, inplace: bool, reduce, copy,
                 state, finish, timeout: float | None = None, asynchronous: bool = False) -> None:
        """`buffers`: 1-D arrays of elements, numbered as in CompiledSchedule; `inplace`: input and
        output are the same memory; `state`: the communicator's CommState. Messages go as bytes:
        [region, MPI.BYTE]. `timeout`: seconds without progress before a wait raises TimeoutError.
        `asynchronous`: `reduce` and `copy` may return, instead of None, something whose `done` turns
        true once the work they queued has finished (a CUDA event); the ops that depend on it wait
        until then."""
        self.plan = plan
        self.actions = plan.in_place_actions if inplace else plan.actions
        self.buffers = buffers
        self.reduce = reduce
        self.copy = copy
        self.asynchronous = asynchronous
        self.state = state
        self.comm = state.comm
        self.seq = state.calls
        self.tag = state.next_tag()
        self.finish = finish
        self.timeout = timeout
        self.pending = list(plan.initial_pending)
        self.remaining = len(plan.initial_pending)
        self.done = False
        self.computes: deque[int] = deque()
        self._run(list(plan.first_ready))
        if self.remaining == 0:
            self._complete()

    def _run(self, ready: list[int]) -> None:
        """Post every ready message; then compute one ready op, and repeat."""
        actions, computes, buffers, pending = self.actions, self.computes, self.buffers, self.pending
        channel_next = self.plan.channel_next
        tracing = timeline.ACTIVE
        while True:
            while ready:
                i = ready.pop()
                action = actions[i]
                kind = action[0] if action is not None else "copy"
                if kind == "send":
                    request = self.comm.Isend([buffers[action[2]][action[3]], BYTE], action[1], self.tag)
                elif kind == "recv":
                    request = self.comm.Irecv([buffers[action[2]][action[3]], BYTE], action[1], self.tag)
                else:
                    computes.append(i)
                    continue
                if tracing:
                    timeline.posted(self, i)
                PROGRESS.add(request, self, i)
                following = channel_next[i]
                if following >= 0:
                    pending[following] -= 1
                    if pending[following] == 0:
                        ready.append(following)
            if not computes:
                return
            i = computes.popleft()
            action = actions[i]
            start = timeline.now() if tracing else 0
            if action is None:
                queued = None  # in place: the input already is the output
            elif action[0] == "reduce":
                (d, ds), (l, ls), (r, rs) = action[1:]
                queued = self.reduce(buffers[l][ls], buffers[r][rs], buffers[d][ds])
            else:
                (d, ds), (s, ss) = action[1:]
                queued = self.copy(buffers[d][ds], buffers[s][ss])
            if tracing:
                timeline.computed(self, i, start)
            if self.asynchronous and queued is not None:
                PROGRESS.add_queued(queued, self, i)
            else:
                self._finished(i, ready)

    def _finished(self, i: int, ready: list[int]) -> None:
        self.remaining -= 1
        pending = self.pending
        for d in self.plan.dependents[i]:
            pending[d] -= 1
            if pending[d] == 0:
                ready.append(d)

    def op_done(self, i: int) -> None:
        """A message, or a queued reduction or copy, has completed."""
        if timeline.ACTIVE and self.actions[i][0] in ("send", "recv"):
            timeline.completed(self, i)
        ready: list[int] = []
        self._finished(i, ready)
        if ready or self.computes:
            self._run(ready)
        if self.remaining == 0:
            self._complete()

    def _complete(self) -> None:
        self.done = True
        self.finish()


class Progress:
    """Every request in flight in this process, with the op it belongs to."""

    def __init__(self) -> None:
        self.requests: list[MPI.Request] = []
        self.owners: list[tuple[Execution, int]] = []
        self.statuses: list[MPI.Status] = []  # Testsome fills them: the size of each message received
        self.queued: list[tuple[object, Execution, int]] = []  # reductions and copies still running

    def add(self, request: MPI.Request, execution: Execution, op: int) -> None:
        self.requests.append(request)
        self.owners.append((execution, op))

    def add_queued(self, work, execution: Execution, op: int) -> None:
        self.queued.append((work, execution, op))

    def poll(self) -> bool:
        """Handle the requests and queued work that completed, if any; say whether any had."""
        finished_work = self.queued and self._poll_queued()
        if not self.requests:
            return bool(finished_work)
        try:
            finished = MPI.Request.Testsome(self.requests, self.statuses)
        except MPI.Exception as error:
            classes = _error_classes(error, self.statuses[:len(self.requests)])
            failing = next((i for i, c in enumerate(classes) if c == MPI.ERR_TRUNCATE or c in _PEER_FAILED), 0)
            execution = self.owners[failing][0] if failing < len(self.owners) else self.owners[0][0]
            translated = _translated(classes, execution.comm)
            if translated is None:
                raise
            raise self.abandon(execution, translated) from None
        if not finished:
            return bool(finished_work)
        owners = self.owners
        done = [owners[i] for i in finished]
        for (execution, op), status in zip(done, self.statuses):
            action = execution.actions[op]
            if action[0] == "recv":
                expected = (action[3].stop - action[3].start) * execution.buffers[action[2]].itemsize
                if status.Get_count(BYTE) != expected:
                    raise self.abandon(execution, _wrong_size(execution.comm, action[1], status.Get_count(BYTE), expected))
        if len(finished) == len(owners):
            self.requests, self.owners = [], []
        else:
            for i in sorted(finished, reverse=True):
                del self.requests[i], owners[i]
        for execution, op in done:
            execution.op_done(op)
        return True

    def _poll_queued(self) -> bool:
        done, running = [], []
        for entry in self.queued:
            (done if entry[0].done else running).append(entry)
        if done:
            self.queued = running
            for _, execution, op in done:
                execution.op_done(op)
        return bool(done)

    def abandon(self, execution: Execution, error: Exception) -> Exception:
        """Give up on `execution`: cancel its receives (and its sends, when a peer failed: else MPI
        would wait for them at exit), and mark its communicator unusable with `error`, which is
        returned to raise."""
        for request, (owner, op) in zip(self.requests, self.owners):
            if owner is not execution or request == MPI.REQUEST_NULL:
                continue
            try:
                if execution.actions[op][0] == "recv" or isinstance(error, PeerFailure):
                    request.Cancel()
                    request.Wait()  # on a revoked communicator this returns (with an error) at once
                else:
                    request.Free()  # a send a live peer may still take: MPI drops it at exit
            except MPI.Exception:
                pass  # a peer failed, or the communicator is revoked: nothing more to undo
        keep = [k for k, (owner, _) in enumerate(self.owners) if owner is not execution]
        self.requests = [self.requests[k] for k in keep]
        self.owners = [self.owners[k] for k in keep]
        self.queued = [entry for entry in self.queued if entry[1] is not execution]
        execution.state.broken = error
        return error

    def wait(self, execution: Execution) -> None:
        """Progress every collective in flight until `execution` is done. With its timeout, raise
        TimeoutError once no message completes for that long, and meanwhile answer other ranks'
        questions about who is still here."""
        timeout = execution.timeout
        idle = 0
        last_progress = next_answer = time.perf_counter()
        while not execution.done:
            if not self.requests and not self.queued:
                raise RuntimeError("ringtree engine: a collective has ops left but nothing in flight")
            if self.poll():
                idle = 0
                if timeout is not None:
                    last_progress = time.perf_counter()
                continue
            if timeout is not None:
                now = time.perf_counter()
                if now >= next_answer:
                    reliability.answer_questions(execution.state, execution.seq)
                    next_answer = now + reliability.ANSWER_EVERY_SECONDS
                if now - last_progress > timeout:
                    waiting = sorted(op for owner, op in self.owners if owner is execution)
                    raise self.abandon(execution, reliability.timed_out(execution, waiting, timeout))
            # Nothing arrived: after a few empty polls, let a process that shares this core run
            # (the peer we wait for, when ranks outnumber cores); with a core to itself, this returns at once.
            idle += 1
            if idle >= SPINS_BEFORE_SLEEP:
                time.sleep(SLEEP_SECONDS)
            elif idle >= SPINS_BEFORE_YIELD:
                os.sched_yield()


# Empty polls before yielding the core: long enough not to slow a dedicated core's fast path.
SPINS_BEFORE_YIELD = 20
# Empty polls (a few milliseconds) before sleeping between polls: a rank with nothing to do for that
# long gives its core to the ranks that have work, at the price of at most one sleep of latency.
SPINS_BEFORE_SLEEP = 2000
SLEEP_SECONDS = 50e-6


PROGRESS = Progress()
