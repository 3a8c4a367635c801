"""The one path of every collective: a call is checked into a Call (collective_args.py), finds or
builds its plan (kept per call shape in its communicator's session) and runs, blocking or started; the
public functions are each a line over `run`. What a call shares with the calls before it, kept in the
session, the shortest way first: its run bound to the same small arrays (again.kept_runs, which the
public functions look up), the same arguments (shapes.py: `repeats`), other arrays of an arrangement
seen before (shapes.of_arrangement), a shape seen before (`shapes`).
docs/design.md, "The call path"."""

from __future__ import annotations

import time
from functools import partial

import numpy as np
from mpi4py import MPI

from ..ops import known_op
from ..runtime.checks import agreement
from ..runtime.checks.refusal import refusing
from ..runtime.engine.empty import EmptyCall
from ..runtime.engine.in_flight import IN_FLIGHT
from ..runtime.engine.mpi_calls import native_start
from ..runtime.engine.native import NativeInFlight, native_runner, run_started, start_native
from ..runtime.engine.roots import ROOTS_SHOWN_MAX, showing_roots, shows_roots
from ..runtime.engine.stepwise import may_step
from ..runtime.safety.mismatch import signature
from ..runtime.safety.stalls import watched
from ..runtime.safety.threads import THREADS
from ..runtime.session import again
from ..runtime.session.one_caller import in_call
from ..runtime.session.plan import build_plan
from ..runtime.session.shapes import (
    REPEATS_MAX,
    arguments_keys,
    keep_shape,
    of_arrangement,
    seen_before,
    shape_key,
)
from ..runtime.session.small import confirm_end
from ..runtime.session.state import existing_state
from ..runtime.session.trials import tuned_plan
from ..runtime.transports.backend import NumpyBackend
from ..runtime.transports.choice import transport_for
from ..schedule.collectives import COLLECTIVES
from ..tuning.collectives import NATIVE, choose
from ..tuning.online import Tuner
from ..tuning.selector import log_choice, select, table
from .buffers import is_plain_call
from .checks import not_native
from .collective_args import Call, checked, checked_call, with_count_matrix
from .converted import converted_call
from .request import Request

__all__ = ["run"]

NDARRAY = np.ndarray


def run(name: str, blocking: bool, comm, algorithm, segment, check, timeout, *buffers):
    """A call of collective `name` on `buffers` (its arguments, as the public function takes them):
    its result where `blocking`, else its Request."""
    if blocking and segment is check is timeout is None:  # new arrays, a result given among them: its shape's run
        ran = again.ran_into_given(name, comm, algorithm, buffers)
        if ran is not again.MISSED:
            return ran
    confirm = None if not blocking else confirm_end if timeout is None else partial(confirm_end, timeout=timeout)
    return in_call(comm, _called, name, blocking, comm, algorithm, segment, check, timeout, buffers, True, confirm=confirm)


def _called(name, blocking, comm, algorithm, segment, check, timeout, buffers, kept):
    """run's call, in the thread rules; `kept`: whether the buffers are the caller's own (not arrays
    made for this call, which the call's repeats must not hold, and which are plain arrays already)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    state = existing_state(comm)  # None before its first call
    if len(buffers) == 4 and COLLECTIVES[name].matrix:  # given counts: the count matrix, which the repeats' key holds
        buffers = with_count_matrix(comm, algorithm, segment, check, timeout, buffers)
    if name == "allreduce" and kept:
        sendbuf, recvbuf, op = buffers
        if not is_plain_call(sendbuf, recvbuf) or (type(op) is not str and known_op(op) is None):
            return _converted(blocking, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op)
    key, arranged = arguments_keys(name, blocking, comm, algorithm, segment, check, timeout, buffers) if kept else (
        None, None)
    repeat = state.repeats.get(key) if key is not None and state is not None else None
    if repeat is not None:
        for array, dtype, written in repeat.arrays:  # a loop: a generator's set-up costs more than the few arrays
            if array.dtype is not dtype or (written and not array.flags.writeable):
                repeat = None
                break
    if repeat is None:
        repeat = _first(state, name, blocking, comm, algorithm, segment, check, timeout, buffers, key, arranged, kept)
        if type(repeat) is tuple:  # ran to its end already: (its result,)
            return repeat[0]
    else:
        if repeat.state.broken is not None:
            repeat.state.check_usable()
        if repeat.comparison is not None:
            _agree(repeat)
    if repeat.context is None:
        return _run(repeat, blocking)
    with repeat.context:  # a CUDA tensor's: torch's current stream
        return _run(repeat, blocking)


def _run(call: Call, blocking: bool):
    """The call (bound) run: blocking, its result; else its Request."""
    state, trial = call.state, call.trial
    if blocking and (call.native is not None or call.run is not None
                     or (call.steps is not None and may_step(state, None))):
        # MPI's own, or a step at a time: waited for here, with no Request to make
        started = time.perf_counter() if trial is not None else 0.0
        if call.native is not None:
            run_started(call.plan.native, state, call.native, call.target, call.what)
        else:
            watched(call.run or call.steps, call.what)
        if trial is not None:
            Tuner.record(trial, time.perf_counter() - started)
        if call.after is not None:
            call.after()
        return call.result
    request = _start(call)
    return request.wait() if blocking else request


def _start(call: Call) -> Request:
    plan, state, trial = call.plan, call.state, call.trial
    if plan.native is not None:
        if trial is not None:  # allreduce's
            native = start_native(plan.native, state, call.source, call.target, call.inplace, trial, call.what)
        else:
            native = NativeInFlight(plan.native, state, call.source, call.target, call.inplace, None, call.what,
                                    call.native)
        return Request(native, call.result, call.after)
    if trial is None:
        execution = plan.start(state, call.source, call.target, call.inplace, call.timeout)
    else:
        started = time.perf_counter()
        execution = plan.start(state, call.source, call.target, call.inplace, call.timeout,
                               lambda: Tuner.record(trial, time.perf_counter() - started))
        Tuner.in_flight(trial, lambda: execution.done or IN_FLIGHT.wait(execution))
    return Request(execution, call.result, call.after)


def _converted(blocking, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op):
    """An allreduce of buffers that are not plain arrays (buffers.converted_call), or that only MPI's own
    allreduce can reduce: their arrays' calls are not kept bound to them."""
    def plain(send, recv, op, comm):
        return _called("allreduce", blocking, comm, algorithm, segment, check, timeout, (send, recv, op), False)

    return converted_call(plain if blocking else None, None if blocking else plain, sendbuf, recvbuf, op, comm,
                          algorithm, timeout)


def _unbound(shape: Call, source, target, result, blocking: bool):
    """A call of `shape`, which runs ringtree's schedule, on arrays of this call alone (new arrays of an
    arrangement seen before), run a step at a time where it may, else started, with nothing bound to
    them (arrays that come again are bound the full way: shapes.seen_before): its result, or its Request."""
    plan, state, inplace = shape.plan, shape.state, shape.inplace
    steps = plan.stepwise_steps(inplace) if blocking and shape.timeout is None else None  # its waits keep none
    if steps is not None and may_step(state, None):
        watched(again.steps_runner(plan, state, steps, source, target), shape.what)
        return result
    request = Request(plan.start(state, source, target, inplace, shape.timeout), result)
    return request.wait() if blocking else request


def _started(plan, state, source, target, inplace: bool, what, result, start=None) -> Request:
    """The Request of a call of `plan` started on these arrays (`start`: native_start's), none to do after."""
    own = plan.native
    return Request(NativeInFlight(own, state, source, target, inplace, None, what, start) if own is not None else
                   plan.start(state, source, target, inplace, None), result)


def _started_on(shape: Call, plan, state, what, source, target, result) -> Request:
    """The Request of a call of `shape` (its plan's) started on these arrays: again._NewResult's start."""
    own = plan.native
    return _started(plan, state, source, target, shape.inplace, what, result,
                    None if own is None else native_start(shape, own, source, target))


def _first(known, name, blocking, comm, algorithm, segment, check, timeout, buffers, key, arranged, kept):
    """A call past the repeat paths (`known`: its communicator's state, if set up): on arrays of an
    arrangement seen before, only what they can fail checked (of_arrangement); else its arguments checked
    and what it shares with the calls of its shape looked up (the session's `shapes`), else found or made
    (its plan among them); bound to its arrays (_bound). A call it runs to its end or starts itself (a small
    allreduce of device memory through host memory, a call with no element): (its result or Request,)."""
    hit = of_arrangement(known, arranged, buffers, key) if arranged is not None and known is not None else None
    if hit is not None:
        shape, source, target, result = hit
        if shape.comparison is not None:
            _agree(shape)
        if shape.plan.native is None:  # unbound, but a shape whose run on new arrays would be kept by it
            kept_as = again.new_result_key(name, buffers)  # (_bound, keep_new_result) and is not: that way
            keeps = shape.timeout is None and shape.comparison is None and (
                shape.plan.stepwise_steps(shape.inplace) is not None if blocking else
                kept_as == id(None) and result is not None)  # an i-function looks up a new result only
            if not (keeps and kept_as not in known.again[name if blocking else "i" + name]):
                return (_unbound(shape, source, target, result, blocking),)
        call = Call(shape.collective, shape.count, source, target, shape.inplace, shape.backend, shape.reduce_op,
                    result, None, None)  # its checked arguments alone: no after, no context (arrangement_of)
        return _bound(shape, call, name, blocking, buffers, None, False, algorithm, segment, check, comm)
    given = timeout
    call, state, current, timeout = checked(name, comm, timeout, partial(checked_call, name, comm, algorithm,
                                                                         segment, check, *buffers))
    if key is not None and arranged is None:  # the first call: its checks read the settings its key names
        arranged = arguments_keys(name, blocking, comm, algorithm, segment, check, given, buffers)[1]
    if (name == "allreduce" and call.backend.staged and call.count * call.source.dtype.itemsize <= current.gpu_host_max
            and transport_for(state, call.backend) is None):
        return (_through_host(call, blocking, comm, algorithm, segment, check, timeout, buffers[2]),)
    if call.count == 0 and state.size > 1:  # no message to show the call: the ranks compare it (runtime/engine/empty.py)
        return (_empty(name, blocking, algorithm, segment, check, timeout, call, state, current),)
    key_of_shape = None
    if call.backend is NumpyBackend and call.context is None:
        key_of_shape = shape_key(name, blocking, comm, algorithm, segment, check, given, current, call.collective,
                                 call.count, call.source.dtype, call.reduce_op, call.inplace)
        seen = state.shapes.get(key_of_shape)
        if seen is not None:
            shape = seen[0]
            if shape.comparison is not None:
                _agree(shape)
            keep_shape(seen, key_of_shape, shape, call, blocking, buffers, key, arranged)  # the arrangement, if new
            if key is None or not seen_before(seen, key, buffers):
                key, kept = None, False  # bound once its arrays come again: new arrays would not use it
            return _bound(shape, call, name, blocking, buffers, key, kept, algorithm, segment, check, comm)
    shape = _shaped(name, comm, algorithm, segment, check, timeout, call, state, current)
    if key_of_shape is not None and shape.trial is None:  # kept with none of the call's arrays
        keep_shape(None, key_of_shape, shape._replace(source=None, target=None, result=None, after=None,
                                                      arguments=(comm, current)), call, blocking, buffers, key, arranged)
    return _bound(shape, call, name, blocking, buffers, key, kept, algorithm, segment, check, comm)


def _shaped(name, comm, algorithm, segment, check, timeout, call, state, current) -> Call:
    """The call with what every call of its shape shares, its plan among it, found or made (the
    comparison of the arguments first, where the ranks compare them); its arrays not yet bound."""
    dtype, backend, reduce_op = call.source.dtype, call.backend, call.reduce_op  # the target's dtype too
    nbytes = call.count * dtype.itemsize
    why_not_native = not_native(backend, dtype, reduce_op, timeout)  # None: MPI's own is a candidate
    native_ok = why_not_native is None
    if algorithm == NATIVE and not native_ok:
        with refusing(comm):
            raise ValueError(f"ringtree {name} on rank {state.rank}: algorithm 'native' (MPI's own) cannot run "
                             f"{why_not_native}")
    compared = current.check if check is None else check
    collective = call.collective
    kind = collective.kind
    matrix = kind.matrix and not collective.alike()
    choice = None if kind.modelled else choose(name, nbytes, state.size, algorithm, segment, native_ok, matrix)
    # Ranks that differ on the root may each send and none receive: a wrong result that no message
    # shows. So a rooted call compares its arguments first unless the caller says check=False, or
    # runs where every rank sees every rank's root (a small broadcast or reduce of MPI's own).
    if (kind.rooted and check is None and not compared and choice.algorithm == NATIVE
            and nbytes <= ROOTS_SHOWN_MAX and shows_roots(name, reduce_op, dtype, state.size)):
        collective = collective._replace(root=None)  # one plan for every root, which the call checks
    sign, comparison = _signed(name, algorithm, segment, call, state, collective,
                               compared or (kind.rooted and collective.root is not None and check is None))
    what = f"{name} on rank {state.rank} of {state.name} ({sign.described()})"
    shape = call._replace(state=state, signature=sign, what=what, timeout=timeout, comparison=comparison)
    if comparison is not None:
        _agree(shape)  # before the plan: making a native one is a collective; online tuning steps on agreed calls
    plan, trial = _plan(state, call, collective, choice, sign, algorithm, segment, current, native_ok, timeout)
    if sign.root is None and not sign.blocks:  # none to name: the plan's, with the peers it waits for
        what = plan.what
    return shape._replace(plan=plan, what=what, trial=trial)


def _signed(name, algorithm, segment, call, state, collective, compared: bool) -> tuple:
    """(signature, comparison or None) of a call: what agreement.agree compares where `compared`."""
    dtype, op = call.source.dtype, call.reduce_op.value if call.reduce_op is not None else None
    root = collective.root if collective.kind.rooted else None
    sign = signature(call.count, dtype, op, algorithm, segment, name, root, collective.counts or None)
    if not compared:
        return sign, None
    described = name + (f" root {sign.root}" if sign.root is not None else "") + (
        f" blocks {list(sign.blocks)}" if sign.blocks else "")
    fields = (call.count, dtype, f"{op}", algorithm, described)
    return sign, (agreement.call_record(*fields), fields, agreement.agreement_described(state, fields))


def _empty(name, blocking, algorithm, segment, check, timeout, call, state, current):
    """A call with no element on any rank (runtime/engine/empty.py): its result, or its Request. Compared first
    in check mode, as any call."""
    sign, comparison = _signed(name, algorithm, segment, call, state, call.collective,
                               current.check if check is None else check)
    if comparison is not None:
        agreement.agree(state, comparison[0], comparison[1], sign, timeout, not THREADS.several, comparison[2])
    request = Request(EmptyCall(state, sign, timeout), call.result, call.after)
    return request.wait() if blocking else request


def _bound(shape: Call, call: Call, name, blocking, buffers, key, kept, algorithm, segment, check, comm) -> Call:
    """The call (`call`, its checked arguments; `shape`, what it shares with the calls of its shape) bound
    to its arrays: kept for its repeats on them under `key` (unless None, or the call makes a new
    result) and, where they are small, by them (keep_again)."""
    plan, state, trial, timeout = shape.plan, shape.state, shape.trial, shape.timeout
    native = run = steps = None
    after = call.after
    if plan.native is not None:
        if blocking:  # a started call starts MPI's nonblocking collective (_start); arrays of this call alone: once
            run = native_runner(plan.native, state, call.source, call.target, call.inplace, call.collective.root,
                                key is None and not kept)
        if run is None and call.collective.kind.rooted and plan.native.collective.root is None:  # it shows the roots
            native, after = showing_roots(state, call, plan.native)
        elif run is None:
            native = native_start(call, plan.native)
    compiled_steps = plan.stepwise_steps(call.inplace) if timeout is None else None  # stepwise waits keep none
    if compiled_steps is not None:
        steps = again.steps_runner(plan, state, compiled_steps, call.source, call.target)
    arrays = tuple((value, value.dtype, value is call.result) for value in buffers if type(value) is NDARRAY)
    repeat = Call(call.collective, call.count, call.source, call.target, call.inplace, call.backend, call.reduce_op,
                  call.result, after, call.context, state, shape.signature, plan, shape.what, timeout, shape.comparison,
                  trial, (comm, *buffers), arrays, native, run, steps)
    # Untimed: neither a trial, nor compared, nor with a segment or timeout of its own. Not an alltoall
    # given counts, which the public functions do not look up: its counts are exchanged at every call.
    if trial is None and repeat.comparison is None and timeout is None and segment is None and check is None:
        if kept and (len(buffers) == 2 or not call.collective.kind.matrix):
            nbytes = call.count * call.source.dtype.itemsize
            if not blocking:  # the plan's start with its arguments bound, where there is nothing to do after
                start = (partial(_start, repeat) if after is not None else partial(
                    _started, plan, state, call.source, call.target, call.inplace, repeat.what, call.result, native))
                again.keep_again(name, False, buffers, call.result, nbytes, algorithm, comm, state, start, None, repeat.what,
                           None)
            elif run is not None or (steps is not None and may_step(state, None)):
                again.keep_again(name, True, buffers, call.result, nbytes, algorithm, comm, state, run or steps, after,
                           repeat.what, confirm_end, run is not None)
        if not blocking:  # for the calls of its shape on new arrays; not one with an after (showing_roots)
            again.keep_new_result(name, buffers, repeat, algorithm, comm, state, plan, repeat.what, None,
                                  partial(_started_on, call, plan, state, repeat.what))
        elif plan.native is not None or steps is not None:
            again.keep_new_result(name, buffers, call, algorithm, comm, state, plan, repeat.what, confirm_end)
    if (key is not None and trial is None and again.may_keep(state, blocking)  # else bound when the arrays come again
            and (call.result is None or any(written for *_, written in arrays))):
        repeats = state.repeats
        if len(repeats) >= REPEATS_MAX:
            repeats.clear()
        repeats[key] = repeat
    return repeat


def _plan(state, call, collective, choice, sign, algorithm, segment, current, native_ok, timeout):
    """(plan, online tuning trial or None) of a call: online tuning's choice for an "auto" allreduce
    that no table rules, else the plan of its shape, built on the first call of it."""
    backend, dtype, reduce_op = call.backend, call.source.dtype, call.reduce_op
    nbytes, op = call.count * dtype.itemsize, sign.op

    def build(choice, plan_key):
        log_choice(collective.name, choice, nbytes, state.size, dtype, op)
        plan = state.plans[plan_key] = build_plan(state, backend, choice, collective, call.count, dtype, reduce_op,
                                                  sign, segment, choice.stepwise)
        return plan

    if (collective.kind.modelled and algorithm == "auto" and segment is None and state.tuner is not None
            and current.algorithm is None
            and not (current.tuning_file and table().match(nbytes, state.size, dtype.name, op, state.topology))):
        plan, trial = tuned_plan(state, call, native_ok, timeout, build)
        if plan is not None:
            return plan, trial
    plan_key = (collective, backend, algorithm, call.count, dtype, reduce_op, segment, native_ok)
    plan = state.plans.get(plan_key)
    if plan is None:
        if choice is None:
            choice = select(nbytes, state.size, dtype.name, op, algorithm, segment, state.topology, native_ok)
        plan = build(choice, plan_key)
    return plan, None


def _agree(repeat: Call) -> None:
    """The call's comparison (check mode, a rooted call): MismatchError on every rank unless every rank
    makes it with the same arguments."""
    record, described, what = repeat.comparison
    agreement.agree(repeat.state, record, described, repeat.signature, repeat.timeout, not THREADS.several, what)


def _through_host(call: Call, blocking, comm, algorithm, segment, check, timeout, op):
    """A small staged allreduce of device memory: the input copied to pinned host memory, allreduced
    there as a numpy call would be (the same messages as the per-message staging), and the copy of the
    result into the target queued on the stream current at the start. The result, or the Request."""
    backend, target = call.backend, call.target
    stream = backend.current_stream()
    host = backend.to_host(call.source)
    ran = _called("allreduce", blocking, comm, algorithm, segment, check, timeout, (MPI.IN_PLACE, host, op), False)
    if blocking:
        backend.to_device(host, target, stream)
        return call.result
    return Request(ran.execution, call.result, lambda: backend.to_device(host, target, stream))
