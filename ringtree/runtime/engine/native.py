"""The MPI library's own collectives, as candidates of `auto` like ringtree's algorithms: what a plan of
one holds (MPICollective, made by native_plan), and its calls."""

from __future__ import annotations

import time
from functools import partial
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ...errors import MismatchError, TimeoutError
from ...ops import MPI_OP, ReduceOp, known_op
from ...schedule.ir import ALLREDUCE, Collective
from ...tuning.online import Tuner
from ..safety.backoff import backed_off, settled
from ..safety.mismatch import Signature, everywhere
from ..safety.reliability import check_given_up
from ..safety.stalls import watched
from ..safety.watch import Watch
from .in_flight import progress_others
from .mpi_calls import native_start, persistent_request
from .roots import byte_view, root_marks, roots_differ

__all__ = ["MPICollective", "NativeInFlight", "reduces", "native_plan", "run_native", "run_started",
           "native_runner", "native_on", "start_native", "free_plan"]

# How long a wait in MPI's own collective only polls and yields before it looks for a mismatch and
# sleeps: MPI moves a large message within a node only as fast as both ranks poll, and a look's
# probes slow a wait that shares a core with a peer's work.
QUIET_SECONDS = 0.01
# Up to this size a blocking call goes through a persistent request (Allreduce_init, ...) on buffers
# of the plan's own, copied into and out of: faster than the nonblocking call (docs/algorithms.md).
PERSISTENT_MAX = 16384


class MPICollective(NamedTuple):
    """What a plan of MPI's own collective (plan.Plan's `native`) holds of it."""

    op: MPI.Op
    average: bool
    divide: object  # for avg: the backend's division by the number of ranks
    comm: MPI.Comm  # the plan's own: native calls that differ between ranks never match (mismatch.py)
    signature: Signature
    # The persistent request's buffers, which a blocking call copies into and out of (None: no request):
    # what it sends, and what it receives (the same where in place; None at a reduce's other ranks).
    buffer: np.ndarray | None
    received: np.ndarray | None
    request: MPI.Prequest | None
    collective: Collective = ALLREDUCE  # the plan's: a broadcast's root None shows the roots
    copies: dict | None = None  # by root: what _plan_copies makes of the persistent request's buffers


def reduces(dtype: np.dtype, op: ReduceOp) -> bool:
    """Whether MPI reduces `dtype` with `op` everywhere: its predefined types in this machine's byte
    order, float16 aside (an extension some MPI libraries lack)."""
    if dtype.char == "e" or dtype.kind not in "biufc" or not dtype.isnative:
        return False
    try:
        MPI.Datatype.fromcode(dtype.char)
    except (KeyError, ValueError):
        return False
    return op in MPI_OP


def native_plan(op: ReduceOp | None, divide, state, count: int, dtype: np.dtype, signature: Signature,
                collective: Collective | None = ALLREDUCE, seq: int | None = None,
                timeout: float | None = None) -> MPICollective:
    """What a plan of MPI's own calls of `count` elements of `collective` on `state`'s communicator holds
    (`op` None for one that reduces nothing): up to PERSISTENT_MAX bytes, a persistent request on
    buffers of its own, unless `collective` is None. Collective: every rank builds it at the same
    call, after the ranks agree on its signature (MPI matches the collectives that make it whatever
    the calls they belong to). `seq`: the number of that call, if it has begun (state.calls: the
    next); its waits look for a mismatch in that call, and the ranks past it are not one. `timeout`: the
    call's, which its waits keep."""
    seq = state.calls if seq is None else seq
    mine = np.array([signature.code, count, -signature.code, -count], np.int64)
    low = np.empty_like(mine)
    _wait(state.control.Iallreduce(mine, low, MPI.MIN), state, seq, signature, (mine, low), timeout)
    if low[0] != -low[2] or low[1] != -low[3]:
        raise everywhere(state, seq, signature, f"the ranks making a plan for MPI's own {signature.collective} differ")
    comm, request = state.comm.Idup()
    _wait(request, state, seq, signature, (comm,), timeout)
    comm.Set_name(f"{state.name} native")
    mpi_op = None if op is None else MPI_OP[op]
    buffer = received = request = None
    if collective is not None and count * dtype.itemsize <= PERSISTENT_MAX:
        try:
            buffer, received, request = persistent_request(collective, comm, count, dtype, mpi_op, state.rank, state.size)
        except NotImplementedError:  # an MPI before persistent collectives: the same on every rank
            buffer = received = request = None
    return MPICollective(mpi_op, op is ReduceOp.AVG, divide, comm, signature, buffer, received, request,
                         collective or ALLREDUCE, {})


def free_plan(own: MPICollective) -> None:
    """Free the plan's persistent request and communicator (not a broken state's: CommState.free)."""
    if own.request:  # not None, and not freed already (a freed request is MPI.REQUEST_NULL)
        own.request.Free()
    own.comm.Free()


def run_native(own: MPICollective, state, source, target, in_place: bool) -> None:
    """MPI's allreduce, nonblocking (persistent or not, by size alone, as MPI matches nonblocking
    collectives only with nonblocking ones), waited for while ringtree's collectives in flight
    progress: a rank blocked in MPI would leave the ranks that wait on those waiting."""
    buffer = own.buffer
    if buffer is None:
        request = own.comm.Iallreduce(MPI.IN_PLACE if in_place else source, target, own.op)
    else:
        buffer[...] = source
        request = own.request
        request.Start()
    seq = state.calls  # counted as every call is (CommState.next_tag)
    state.calls = seq + 1
    if not settled(request.Test, progress_others):
        _wait(request, state, seq, own.signature, (source, target))
    if buffer is not None:
        target[...] = buffer
    if own.average:
        own.divide(target, state.size)


def run_started(own: MPICollective, state, start, target, what) -> None:
    """MPI's own collective that `start()` starts, nonblocking, on the plan's communicator, waited
    for as run_native waits (the other collectives' native calls)."""
    request = start()
    seq = state.calls  # counted as every call is (CommState.next_tag)
    state.calls = seq + 1
    if not settled(request.Test, progress_others):
        watched(partial(_wait, request, state, seq, own.signature, (target,)), what)
    if own.average:
        own.divide(target, state.size)


def native_runner(own: MPICollective, state, source, target, in_place: bool, root: int | None = 0, once=False):
    """A blocking call of these arguments (`root`: a broadcast's or reduce's) as a function of none: through
    the plan's persistent request, bound to the arrays unless `once`; else run_native's for an allreduce."""
    if own.request is None:
        return partial(run_native, own, state, source, target, in_place) if own.collective is ALLREDUCE else None
    if once:
        return partial(_through_request(own, state, source, target, root), source, target)
    return _through_request(own, state, source, target, root, bound=True)


def native_on(own: MPICollective, state, call, what):
    """A blocking call of `call`'s shape (a collective_args.Call) through MPI's own `own`, as a
    function of (source, target), for the calls of its shape on new arrays (again._NewResult). None for
    a rooted call that shows its roots with no persistent request (roots.showing_roots)."""
    if own.request is not None:
        return _through_request(own, state, call.source, call.target, call.collective.root)
    if own.collective.root is None and own.collective.kind.rooted:
        return None
    return lambda source, target: run_started(own, state, native_start(call, own, source, target), target, what)


def _through_request(own: MPICollective, state, source, target, root, bound: bool = False):
    """A blocking call through the plan's persistent request as a function of (source, target), arrays
    like `source` and `target` (sizes, dtype), or, `bound`, of none on these: copied into the
    request's buffers, the request started and waited for as run_native waits, the roots checked
    where it shows them, copied out. What the copies take and give is made once per root
    (own.copies); bound, as memoryviews of the arrays too, made once: a copy between two costs half
    a numpy assignment's time at 8 B, a memoryview made for it twice."""
    made = own.copies.get(root)
    if made is None:
        made = own.copies[root] = _plan_copies(own, state.rank, source, target, root)
    ins, outs, roots = made
    request, test, signature, divide = own.request, own.request.Test, own.signature, own.divide if own.average else None

    if not bound:
        def run(source, target) -> None:
            arrays = (source, target)
            for into, given in ins:
                into[...] = arrays[given] if type(given) is int else given
            request.Start()
            seq = state.calls  # counted as every call is (CommState.next_tag)
            state.calls = seq + 1
            if not settled(test, progress_others):
                _wait(request, state, seq, signature, ())
            if roots is not None and roots[0] != roots[1]:
                roots_differ(state, own.collective.name, root, seq)
            for to, received in outs:
                arrays[to][...] = received
            if divide is not None:
                divide(target, state.size)
        return run
    views = (byte_view(source), byte_view(target))
    copies_in, copies_out = ([tuple(views[side] if type(side) is int else byte_view(side) for side in pair)
                              for pair in pairs] for pairs in (ins, outs))
    if roots is None and divide is None and len(copies_in) == len(copies_out) == 1:
        (into, given), (out, received) = copies_in[0], copies_out[0]

        def run_one() -> None:  # every allreduce's: no loop, as a loop's set-up counts at 8 B
            into[:] = given
            request.Start()
            seq = state.calls  # counted as every call is (CommState.next_tag)
            state.calls = seq + 1
            if not settled(test, progress_others):
                _wait(request, state, seq, signature, ())
            out[:] = received
        return run_one

    def run_bound() -> None:
        for into, given in copies_in:
            into[:] = given
        request.Start()
        seq = state.calls  # counted as every call is (CommState.next_tag)
        state.calls = seq + 1
        if not settled(test, progress_others):
            _wait(request, state, seq, signature, ())
        if roots is not None and roots[0] != roots[1]:
            roots_differ(state, own.collective.name, root, seq)
        for into, given in copies_out:
            into[:] = given
        if divide is not None:
            divide(target, state.size)
    return run_bound


def _plan_copies(own: MPICollective, rank: int, source, target, root):
    """(copies in, copies out, roots) of _through_request for a call whose arrays are like `source` and
    `target`: (to, from) pairs, 0 and 1 standing for the call's source and target, what lies in the
    plan's buffers as arrays of the call's dtype (the roots' marks: bytes); roots, for a broadcast or
    reduce that shows them (roots.py), memoryviews of the marks the ranks' roots combined to and of
    those this rank's gives."""
    collective, buffer, dtype = own.collective, own.buffer.view(np.uint8), target.dtype
    kind = collective.kind
    if collective.root is None and kind.rooted:  # it shows the roots (roots.py)
        nbytes, at_root = (source if kind.has_input else target).nbytes, rank == root
        mine, combined = root_marks(collective.name, known_op(own.op), dtype, own.comm.Get_size(), root)
        data, marks = buffer[:nbytes].view(dtype), buffer[nbytes:]
        if kind.reduces:
            given, outs = 0, [(1, data)] if at_root else []
        else:  # a broadcast's others give zeros
            given = 1 if at_root else np.zeros_like(data)
            outs = [] if at_root else [(1, data)]
        return [(data, given), (marks, np.frombuffer(mine, np.uint8))], outs, (memoryview(marks), combined)
    if not kind.has_input:  # a broadcast's root gives its target, the others receive into theirs
        whole = buffer.view(dtype)
        return ([(whole, 1)], [], None) if rank == root else ([], [(1, whole)], None)
    offset = kind.first_input(collective, rank) * target.itemsize  # an allgather's block in the buffer
    received = own.received
    outs = [] if received is None else [(1, received.view(np.uint8).view(dtype))]
    return [(buffer[offset:offset + source.nbytes].view(dtype), 0)], outs, None


class NativeInFlight:
    """MPI's own collective of a call on its plan's communicator: an Iallreduce of `source` into `target`,
    or what `start()` starts (native_start's; passed_through.py's, whose `source` is the arrays MPI
    writes into); given a `persistent` request of the arrays, done until restart() starts it
    (persistent.py). Its waits progress ringtree's collectives in flight and look for a mismatch, as
    a blocking call's do; with a `timeout`, they keep it, and a rank that gave the call up meanwhile
    is an error once it is done."""

    __slots__ = ("own", "state", "comm", "request", "seq", "source", "target", "then", "what", "done", "timeout")

    def __init__(self, own: MPICollective, state, source, target, in_place: bool, then, what, start=None,
                 timeout: float | None = None, persistent: MPI.Prequest | None = None) -> None:
        """`then()`, if given, runs once it is done; `what`: the call as a stall warning describes it."""
        self.own, self.state, self.comm, self.source, self.target = own, state, state.comm, source, target
        self.then, self.what, self.done, self.timeout = then, what, False, timeout
        if persistent is not None:
            self.request, self.done, self.seq = persistent, True, 0
            return
        if start is None:
            self.request = own.comm.Iallreduce(MPI.IN_PLACE if in_place else source, target, own.op)
        else:
            self.request = start()
        self.seq = state.calls  # counted as every call is (CommState.next_tag)
        state.calls = self.seq + 1

    def restart(self) -> None:
        """The persistent request's next call, started."""
        state = self.state
        if state.broken is not None:
            state.check_usable()
        self.request.Start()
        self.done = False
        self.seq = state.calls  # counted as every call is (CommState.next_tag)
        state.calls = self.seq + 1

    def test(self) -> bool:
        if not self.done:
            progress_others()
            if self.request.Test():
                self._complete()
        return self.done

    def wait(self) -> None:
        if self.done:
            return
        if not settled(self.request.Test, progress_others):
            watched(partial(_wait, self.request, self.state, self.seq, self.own.signature,
                            (self.source, self.target), self.timeout), self.what)
        self._complete()

    def _complete(self) -> None:
        self.done = True
        if self.timeout is not None:  # its messages may have come from a rank that left it since
            check_given_up(self.state, self.seq, self.own.signature.collective)
        if self.own.average:
            self.own.divide(self.target, self.state.size)
        if self.then is not None:
            self.then()


def start_native(own: MPICollective, state, source, target, in_place: bool, trial, what) -> NativeInFlight:
    """iallreduce's call of MPI's own allreduce as a trial of online tuning, started: it records its time."""
    started = time.perf_counter()

    def finish() -> None:
        Tuner.record(trial, time.perf_counter() - started)

    native = NativeInFlight(own, state, source, target, in_place, finish, what)
    Tuner.in_flight(trial, native.wait)
    return native


def _wait(request: MPI.Request, state, seq: int, signature: Signature, arrays: tuple,
          timeout: float | None = None) -> None:
    """Poll `request`, which settled() did not see done, to completion (under MPICH faster than MPI's
    Wait, which also could not be left): with collectives in flight, progressing them; when idle,
    looking for a mismatch, and past `timeout` raising TimeoutError. Left by either, the request stays
    in flight, so its `arrays` are kept with the broken communicator's state: MPI may still write into
    them (a peer's part of the collective, arriving late)."""
    try:
        backed_off(request.Test, progress_others, QUIET_SECONDS,
                   partial(Watch, state, seq, signature, announce=True, timeout=timeout,
                           waits_for=f"it waits in MPI's own {signature.collective}"))
    except (MismatchError, TimeoutError):
        state.abandoned.append((request, arrays))
        raise
