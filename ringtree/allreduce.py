"""The public allreduce: `allreduce` and `iallreduce`, in the style of mpi4py.

Arguments are checked on the calling rank before any message is sent, so bad
input raises TypeError or ValueError and leaves the buffers untouched.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np
from mpi4py import MPI

from . import settings
from .buffers import converted_call, is_plain_call
from .checks import checked, checked_timeout
from .errors import TimeoutError
from .ops import known_op, named_defaults
from .request import Request
from .runtime import agreement
from .runtime.again import AGAIN, AGAIN_MAX, forget_bound, keep_again, repeat_key, repeat_of, steps_runner
from .runtime.backend import NumpyBackend, backend_for
from .runtime.backoff import wait_until
from .runtime.in_flight import IN_FLIGHT, progress_others
from .runtime.mismatch import Watch, signature
from .runtime.native import NativePlan, reduces, run_native, start_native
from .runtime.one_caller import in_call, intruded, one_caller
from .runtime.plan import Plan, build_plan
from .runtime.refusal import refusing
from .runtime.small import confirm_end, slowest
from .runtime.stalls import WAITING, watched
from .runtime.state import comm_state
from .runtime.stepwise import bound_steps, may_step
from .runtime.threads import FIRST_IN, THREADED, get_ident, note_thread
from .runtime.transports import transport_for
from .schedule.ir import ALLREDUCE
from .tuning.online import Tuner, key_of
from .tuning.selector import choice_of, log_choice, select, table

__all__ = ["allreduce", "iallreduce", "Request"]

# Looked up once: the repeat path counts every 0.1 µs.
IN_PLACE, WORLD, NDARRAY = MPI.IN_PLACE, MPI.COMM_WORLD, np.ndarray


def allreduce(sendbuf, recvbuf=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None, check=None,
              timeout=None):
    """Combine `sendbuf` from every rank of `comm` with `op`; every rank gets the result.

    `sendbuf` is a C-contiguous array, or MPI.IN_PLACE with the input in
    `recvbuf`. The result goes into `recvbuf` (a new array when None), which is
    returned. `algorithm` is "auto" or a name from ringtree.algorithms.ALGORITHMS;
    `segment` (bytes) overrides the pipeline's segment size. `check=True`
    (default: RINGTREE_CHECK) makes the ranks agree on the call's arguments
    first and raise MismatchError if they differ; `timeout` (seconds, default:
    RINGTREE_TIMEOUT) raises TimeoutError when the collective makes no progress
    for that long. Both must be the same on every rank.
    """
    again = AGAIN.get(id(recvbuf))
    if (again is not None and sendbuf is again.sendbuf and op is again.op and algorithm is again.algorithm
            and comm is again.comm and segment is check is timeout is None and again.thread == get_ident()
            and again.state.broken is None and recvbuf.flags.writeable and recvbuf.dtype is again.dtype
            and (again.inplace or sendbuf.dtype is again.dtype)
            and (again.native or not (IN_FLIGHT.requests or IN_FLIGHT.queued))):
        if THREADED[1]:
            return one_caller(comm, _watched_again, again, recvbuf, confirm=confirm_end)
        outer, FIRST_IN[0] = FIRST_IN[0], again.handle  # as one_caller.in_call marks the first thread's call
        WAITING[0] = again  # for the stall watchdog (runtime/stalls.py): watched, inlined
        try:
            if THREADED[1]:  # THREADED read again: a second thread has called since
                one_caller(comm, again.run, confirm=confirm_end)
            else:
                again.run()
        finally:
            FIRST_IN[0], WAITING[0] = outer, None
            WAITING[1] += 1
        if FIRST_IN[1] is not None:
            intruded()
        return recvbuf
    return in_call(comm, _allreduce, sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout,
                   confirm=confirm_end if timeout is None else partial(confirm_end, timeout=timeout))


def _watched_again(again, recvbuf):
    watched(again.run, again.call)
    return recvbuf


def _allreduce(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout):
    """allreduce past its fastest path."""
    if not is_plain_call(sendbuf, recvbuf) or (type(op) is not str and known_op(op) is None):
        return converted_call(partial(_reduce, kept=False), None, sendbuf, recvbuf, op, comm, algorithm, segment,
                              check, timeout)
    if recvbuf is None and type(sendbuf) is NDARRAY:
        # A new result array, so that a call shape seen before finds its plan (repeat_of) whatever the
        # arrays; not kept bound: the next call brings other arrays.
        return _reduce(sendbuf, np.empty_like(sendbuf), op, comm, algorithm, segment, check, timeout, kept=False)
    return _reduce(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout)


def _reduce(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout, kept=True):
    """allreduce of plain arrays; `kept`: the caller's own, which a repeat on them may run bound to (not
    arrays made for this call, which would hold the caller's exported memory)."""
    trial = None
    repeat = repeat_of(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout)
    if repeat is not None:
        call, state, steps, source, target, inplace = repeat
        result, repeatable = recvbuf, True
    else:
        call, state, source, target, result, inplace, timeout, trial = _prepare(
            sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout)
        if call is None:
            return _through_host(source, target, result, op, comm, algorithm, segment, check, timeout, True)
        steps = call.in_place_steps if inplace else call.steps
        if type(call) is not NativePlan and (steps is None or not may_step(state, timeout)):
            return _start(call, state, source, target, result, inplace, timeout, trial).wait()
        # A stepwise or native plan runs here; one that is not a trial, check or given segment is repeated.
        repeatable = _remembered(state, call, op, algorithm, target, inplace, trial, check, segment)
    what = call.what
    if (repeatable and kept and result is recvbuf and type(recvbuf) is NDARRAY and target.nbytes <= AGAIN_MAX
            and (inplace or type(sendbuf) is NDARRAY) and (state.signatures or not THREADED[1])):
        watched(keep_again(sendbuf, recvbuf, op, algorithm, comm, state, call, steps, source, target, inplace,
                            what).run, what)
        return recvbuf
    started = time.perf_counter()
    if type(call) is NativePlan:
        watched(partial(run_native, call, state, source, target, inplace), what)
    else:
        # Small, and nothing else in flight to progress meanwhile: run it a step at a time.
        bound = bound_steps(steps, [source, target, *call.stepwise_scratch], state.remote)
        watched(steps_runner(call, state, bound, target), what)
    if trial is not None:
        Tuner.record(trial, time.perf_counter() - started)
    return result


def iallreduce(sendbuf, recvbuf=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None, check=None,
               timeout=None) -> Request:
    """Start an allreduce and return its Request; arguments as for `allreduce` (the timeout applies to
    waiting on it; in check mode, the ranks agree before this returns)."""
    return in_call(comm, _istart, sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout)


def _istart(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout) -> Request:
    if not is_plain_call(sendbuf, recvbuf) or (type(op) is not str and known_op(op) is None):
        return converted_call(None, _istart_plain, sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout)
    if recvbuf is None and type(sendbuf) is NDARRAY:  # as in _allreduce
        recvbuf = np.empty_like(sendbuf)
    return _istart_plain(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout)


def _istart_plain(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout) -> Request:
    repeat = repeat_of(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout, False)
    if repeat is not None:
        call, state, _, source, target, inplace = repeat
        trial = None
    else:
        call, state, source, target, recvbuf, inplace, timeout, trial = _prepare(
            sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout)
        if call is None:
            return _through_host(source, target, recvbuf, op, comm, algorithm, segment, check, timeout, False)
        if type(call) is NativePlan:
            _remembered(state, call, op, algorithm, target, inplace, trial, check, segment)
    if type(call) is NativePlan:
        what = call.what
        return Request(start_native(call, state, source, target, inplace, trial, what), recvbuf)
    return _start(call, state, source, target, recvbuf, inplace, timeout, trial)


def _remembered(state, call, op, algorithm, target, inplace, trial, check, segment) -> bool:
    """Keep `call`'s plan for repeat_of's shortcut, unless the call is a trial, in check mode or of a
    given segment; say whether it was kept."""
    if trial is not None or check is not None or segment is not None or settings.current().check or known_op(op) is None:
        return False
    state.repeats[repeat_key(op, algorithm, target, inplace)] = call
    return True


def _through_host(source, target, recvbuf, op, comm, algorithm, segment, check, timeout, blocking):
    """A small staged CuPy call: copy the input to pinned host memory, allreduce it there as a numpy
    call would (the same messages as the per-message staging), and queue the copy of the result into
    `target` on the stream current at the start. Returns recvbuf, or the Request when not `blocking`."""
    backend = backend_for(source)
    stream = backend.current_stream()
    host = backend.to_host(source)
    arguments = dict(comm=comm, algorithm=algorithm, segment=segment, check=check, timeout=timeout)
    if blocking:
        allreduce(MPI.IN_PLACE, host, op, **arguments)
        backend.to_device(host, target, stream)
        return recvbuf
    request = iallreduce(MPI.IN_PLACE, host, op, **arguments)
    return Request(request._execution, recvbuf, lambda: backend.to_device(host, target, stream))


def _prepare(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout):
    """Check the arguments and find (or build) the call plan; in check mode, agree with the other
    ranks on the call; return what a call needs, and the online tuning trial it is, if any."""
    if comm is None:
        comm = MPI.COMM_WORLD
    with refusing(comm):
        sendbuf, recvbuf, reduce_op, backend, inplace = checked(sendbuf, recvbuf, op, comm, algorithm, segment)
        if note_thread(comm) and AGAIN:
            forget_bound()  # with RINGTREE_SIGNATURES=0 their runs wait inside MPI, which no call may then
        try:
            current = settings.current()
        except settings.SettingError as error:
            comm_state(comm)  # a new communicator's set-up compares every rank's settings: none waits for this one
            raise settings.SettingError(f"ringtree allreduce on rank {comm.Get_rank()}: {error}") from None
        timeout = checked_timeout(timeout, comm, current.timeout)
        if check is not None and not isinstance(check, bool):
            raise TypeError(f"ringtree allreduce on rank {comm.Get_rank()}: check must be True, False or None, "
                            f"got {check!r}")
        state = comm_state(comm, timeout)
    state.check_usable()
    if recvbuf is None:
        recvbuf = backend.empty_like(sendbuf)
    target = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
    source = target if inplace else sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)
    dtype = target.dtype
    if backend.staged and target.nbytes <= current.gpu_host_max and transport_for(state, backend) is None:
        return None, state, source, target, recvbuf, inplace, timeout, None  # for _through_host
    if current.check if check is None else check:
        # Before the choice: online tuning takes its steps on the arguments the ranks agree on here.
        agreement.agree(state, agreement.call_record(target.size, dtype, reduce_op.value, algorithm),
                        (target.size, dtype, reduce_op.value, algorithm, "allreduce"),
                        signature(target.size, dtype, reduce_op.value, algorithm, segment), timeout, not THREADED[1])
    call = trial = None
    if (algorithm == "auto" and segment is None and state.tuner is not None and current.algorithm is None
            and not (current.tuning_file and table().match(target.nbytes, state.size, dtype.name, reduce_op.value,
                                                             state.topology))):
        call, trial = _tuned_plan(state, backend, target, reduce_op, inplace, timeout is None, timeout)
    if call is None:
        call = state.plans.get((backend, algorithm, target.size, dtype, reduce_op, segment))
        if call is None:
            choice = select(target.nbytes, state.size, dtype.name, reduce_op.value, algorithm, segment, state.topology,
                            timeout is None and backend is NumpyBackend and reduces(dtype, reduce_op))
            call = _plan(state, backend, choice, target, reduce_op, (backend, algorithm, target.size, dtype, reduce_op,
                                                                     segment), algorithm, segment)
    return call, state, source, target, recvbuf, inplace, timeout, trial


def _tuned_plan(state, backend, target, reduce_op, inplace, native, timeout):
    """The plan online tuning chooses for an "auto" call (tuning/online.py), and the trial it is."""
    native = native and backend is NumpyBackend and reduces(target.dtype, reduce_op)
    key = key_of(target.nbytes, inplace, target.dtype.itemsize, native)
    chosen = state.tuner.choose(key, partial(slowest, state, timeout))
    if chosen is None:
        return None, None  # nothing learned, and not learning: the table or the model chooses
    option, why, trial = chosen
    plan_key = (backend, option, target.size, target.dtype, reduce_op)
    call = state.plans.get(plan_key)
    if call is None:
        call = _plan(state, backend, choice_of(option.algorithm, target.nbytes, option.segment, why), target, reduce_op,
                     plan_key, "auto", None)
    if trial is not None and key.size_class <= LINE_UP_CLASS:
        _line_up(state, call.signature, timeout)
    return call, trial


# Trials of messages under 64 KiB start together (_line_up): their few microseconds would be mostly
# the ranks' skew. Larger ones are timed as they come, back to back with the calls before them, as
# a program runs them (after a barrier, a 256 KiB Rabenseifner in place took half its time in a loop).
LINE_UP_CLASS = 16


def _line_up(state, signature, timeout) -> None:
    """Start a trial on every rank together, so that its time is the call's and not a rank's wait for
    a later one: a barrier, waited for while the collectives in flight progress."""
    request = state.comm.Ibarrier()  # never Barrier: a rank with collectives in flight must poll, and the two do not match
    deadline = None if timeout is None else time.perf_counter() + timeout

    def arrived() -> bool:
        if request.Test():
            return True
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError(f"ringtree allreduce on rank {state.rank}: not every rank came to the barrier "
                               f"before a tuning trial within {timeout:g} s")
        return False

    # Backing off: ranks that outnumber the cores must get to run and arrive. Announced: a rank in
    # another call may wait for messages that these ranks send only after the barrier.
    watched(partial(wait_until, arrived, progress_others, 0.0, (Watch, state, state.calls, signature, None, True)),
            f"allreduce on rank {state.rank} of {state.comm.Get_name()}, in the barrier that starts a tuning trial")


def _plan(state, backend, choice, target, reduce_op, plan_key, algorithm, segment) -> Plan | NativePlan:
    """Build the plan of `choice` for a new call shape, kept under `plan_key` for the calls after;
    `algorithm` and `segment` are the caller's, for the plan's signature."""
    dtype = target.dtype
    log_choice(choice, target.nbytes, state.size, dtype, reduce_op.value)
    call = state.plans[plan_key] = build_plan(state, backend, choice, ALLREDUCE, target.size, dtype, reduce_op,
                                              signature(target.size, dtype, reduce_op.value, algorithm, segment),
                                              segment, choice.stepwise)
    return call


def _start(call: Plan, state, source, target, recvbuf, inplace, timeout, trial=None) -> Request:
    if trial is None:
        return Request(call.start(state, source, target, inplace, timeout), recvbuf)
    started = time.perf_counter()
    execution = call.start(state, source, target, inplace, timeout,
                           lambda: Tuner.record(trial, time.perf_counter() - started))
    Tuner.in_flight(trial, lambda: execution.done or IN_FLIGHT.wait(execution))
    return Request(execution, recvbuf)


named_defaults(allreduce, iallreduce)
