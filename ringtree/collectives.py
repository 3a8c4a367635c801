"""The other collectives: `reduce_scatter`, `allgather`, `broadcast` and `reduce`, and their
nonblocking forms, in the style of `allreduce` (and of mpi4py's Reduce_scatter, Allgatherv, Bcast
and Reduce).

They run through the same schedules, engine, mismatch detection, timeouts and thread rules as
allreduce; `auto` chooses among their algorithms and MPI's own (tuning/collectives.py). Arguments
are checked on the calling rank before any message is sent (collective_args.py).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import settings
from .checks import check_comm, check_options, checked_timeout
from .collective_args import Prepared, prepared
from .debug import log
from .ops import ReduceOp, named_defaults
from .persistent import PersistentRequest
from .request import Request
from .runtime import agreement
from .runtime.again import REPEATS, REPEATS_MAX, steps_runner
from .runtime.backend import NumpyBackend
from .runtime.mismatch import Signature, signature
from .runtime.native import ROOTS_SHOWN_MAX, NativeInFlight, NativePlan, broadcast_showing_roots, reduces, run_started
from .runtime.one_caller import in_call
from .runtime.plan import Plan, build_plan
from .runtime.refusal import refusing
from .runtime.small import confirm_end
from .runtime.stalls import watched
from .runtime.state import comm_state
from .runtime.stepwise import bound_steps, may_step
from .runtime.threads import THREADED
from .tuning.collectives import NATIVE, choose

__all__ = ["reduce_scatter", "ireduce_scatter", "reduce_scatter_init", "allgather", "iallgather", "allgather_init",
           "broadcast", "ibroadcast", "broadcast_init", "reduce", "ireduce", "reduce_init"]

_OPTIONS = """`algorithm` is "auto" or one of ringtree.algorithms.GENERATORS[collective]; `segment`
    (bytes) overrides the pipeline's segment size; `check` and `timeout` are as for allreduce."""


def reduce_scatter(sendbuf, recvbuf=None, counts=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None,
                   check=None, timeout=None):
    """Combine `sendbuf` from every rank of `comm` with `op`; rank r gets block r of the result.

    `sendbuf` holds every rank's block, in rank order, block r of `counts[r]` elements (default:
    equal blocks, which must divide it). With sendbuf MPI.IN_PLACE, recvbuf holds the input and gets
    the block at its start. The block goes into `recvbuf` (a new array when None), which is returned.
    """
    return _run("reduce_scatter", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, counts, op)


def ireduce_scatter(sendbuf, recvbuf=None, counts=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None,
                    check=None, timeout=None) -> Request:
    """Start a reduce_scatter and return its Request (wait() returns the block)."""
    return _run("reduce_scatter", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, counts, op)


def allgather(sendbuf, recvbuf=None, counts=None, *, comm=None, algorithm="auto", segment=None, check=None,
              timeout=None):
    """Every rank of `comm` gets every rank's `sendbuf`, in rank order, in `recvbuf`, which is returned.

    `counts[r]` is rank r's number of elements (default: every rank's is sendbuf's). With sendbuf
    MPI.IN_PLACE, this rank's block is already in place in recvbuf. A new recvbuf (for None) has
    shape (ranks, *sendbuf.shape) where no counts are given, else is 1-D.
    """
    return _run("allgather", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, counts)


def iallgather(sendbuf, recvbuf=None, counts=None, *, comm=None, algorithm="auto", segment=None, check=None,
               timeout=None) -> Request:
    """Start an allgather and return its Request (wait() returns recvbuf)."""
    return _run("allgather", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, counts)


def broadcast(buf, root=0, *, comm=None, algorithm="auto", segment=None, check=None, timeout=None):
    """Every rank of `comm` gets rank `root`'s `buf` in its own `buf`, which is returned."""
    return _run("broadcast", True, comm, algorithm, segment, check, timeout, buf, root)


def ibroadcast(buf, root=0, *, comm=None, algorithm="auto", segment=None, check=None, timeout=None) -> Request:
    """Start a broadcast and return its Request (wait() returns buf)."""
    return _run("broadcast", False, comm, algorithm, segment, check, timeout, buf, root)


def reduce(sendbuf, recvbuf=None, op=MPI.SUM, root=0, *, comm=None, algorithm="auto", segment=None, check=None,
           timeout=None):
    """Combine `sendbuf` from every rank of `comm` with `op` into the root's `recvbuf` (a new array
    when None), which the root gets back; the other ranks get None (their recvbuf is not looked at).
    With sendbuf MPI.IN_PLACE, the root's recvbuf holds its input."""
    return _run("reduce", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op, root)


def ireduce(sendbuf, recvbuf=None, op=MPI.SUM, root=0, *, comm=None, algorithm="auto", segment=None, check=None,
            timeout=None) -> Request:
    """Start a reduce and return its Request (wait() returns the result at the root, else None)."""
    return _run("reduce", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op, root)


def reduce_scatter_init(sendbuf, recvbuf, counts=None, op=MPI.SUM, *, comm=None, algorithm="auto", check=None,
                        timeout=None) -> PersistentRequest:
    """A persistent reduce_scatter of these buffers (as allreduce_init is of allreduce)."""
    return _persistent("reduce_scatter", comm, algorithm, check, timeout, sendbuf, recvbuf, counts, op)


def allgather_init(sendbuf, recvbuf, counts=None, *, comm=None, algorithm="auto", check=None,
                   timeout=None) -> PersistentRequest:
    """A persistent allgather of these buffers."""
    return _persistent("allgather", comm, algorithm, check, timeout, sendbuf, recvbuf, counts)


def broadcast_init(buf, root=0, *, comm=None, algorithm="auto", check=None, timeout=None) -> PersistentRequest:
    """A persistent broadcast of this buffer."""
    return _persistent("broadcast", comm, algorithm, check, timeout, buf, root)


def reduce_init(sendbuf, recvbuf, op=MPI.SUM, root=0, *, comm=None, algorithm="auto", check=None,
                timeout=None) -> PersistentRequest:
    """A persistent reduce of these buffers (recvbuf may be None on the other ranks than the root)."""
    return _persistent("reduce", comm, algorithm, check, timeout, sendbuf, recvbuf, op, root)


for _function in (reduce_scatter, allgather, broadcast, reduce):
    _function.__doc__ += "\n    " + _OPTIONS + "\n"


def _persistent(name, comm, algorithm, check, timeout, *buffers) -> PersistentRequest:
    """The arguments checked once, here; every Start starts the nonblocking call of them."""
    comm = MPI.COMM_WORLD if comm is None else comm
    with refusing(comm):
        check_comm(comm, name)
        check_options(name, comm, algorithm, None, check)
        call = prepared(name, comm, *buffers)
        needs = name in ("reduce_scatter", "allgather") or (name == "reduce" and comm.Get_rank() == call.collective.root)
        if needs and buffers[1] is None:
            raise ValueError(f"ringtree {name}_init on rank {comm.Get_rank()}: a persistent {name} needs recvbuf: "
                             "the result goes there at every Wait")
        checked_timeout(timeout, comm, None)
    return PersistentRequest(partial(_run, name, False, comm, algorithm, None, check, timeout, *buffers), name)


def _run(name, blocking, comm, algorithm, segment, check, timeout, *buffers):
    run = (_started, name, blocking, comm, algorithm, segment, check, timeout, *buffers)
    confirm = None if not blocking else confirm_end if timeout is None else partial(confirm_end, timeout=timeout)
    return in_call(comm, *run, confirm=confirm)


def _started(name, blocking, comm, algorithm, segment, check, timeout, *buffers):
    comm = MPI.COMM_WORLD if comm is None else comm
    key = _repeat_key(name, comm, algorithm, segment, check, timeout, buffers)
    repeat = REPEATS.get(key) if key is not None else None
    if repeat is not None:
        for array in repeat.written:  # a loop: a generator's set-up costs more than the few arrays
            if not array.flags.writeable:
                repeat = None
                break
    if repeat is None:
        repeat = _first(name, comm, algorithm, segment, check, timeout, buffers, key)  # agreed already
    else:
        repeat.state.check_usable()
        if repeat.comparison is not None:
            _agree(repeat)
    call, state = repeat.call, repeat.state
    with call.context:
        if blocking and (repeat.native is not None or (repeat.steps is not None and may_step(state, None))):
            # MPI's own, or a step at a time: waited for here, with no Request to make
            if repeat.native is not None:
                run_started(repeat.plan, state, repeat.native, call.target, repeat.what)
            else:
                watched(repeat.steps, repeat.what)
            if repeat.after is not None:
                repeat.after()
            return call.result
        request = _start(call, state, repeat, repeat.timeout)
        if blocking:
            return request.wait()
    return request


class _Repeat(NamedTuple):
    """What a call shares with the calls after it on the same arguments: looked up, not rebuilt."""

    arguments: tuple  # the caller's communicator and buffers, held so that their ids in the key stay theirs
    written: tuple  # the caller's arrays the call writes: still writable?
    call: Prepared
    state: object
    signature: Signature
    dtype: object
    plan: object
    native: object  # for a native plan: start(comm), MPI's own nonblocking collective of the call; else None
    steps: object  # for a plan the stepwise path may run: a function of none running it on the call's arrays
    what: str  # the call as a stall warning names it
    timeout: float | None
    comparison: tuple | None  # (record, call, what) for agreement.agree, where the ranks compare the call first
    after: object  # None, or what to do once the call is done (Prepared.after, or a native call's own)


def _repeat_key(name, comm, algorithm, segment, check, timeout, buffers) -> tuple | None:
    """The key of a call whose arrays are numpy's own and whose other arguments are plain values;
    None for any other (a new result each time, tensors, buffer specifications)."""
    parts = [name, id(comm), algorithm, segment, check, timeout]
    for value in buffers:
        if type(value) is np.ndarray or isinstance(value, (MPI.Op, ReduceOp)) or value is MPI.IN_PLACE:
            parts.append(id(value))
        elif value is None or type(value) in (int, str):
            parts.append(value)
        elif type(value) in (list, tuple) and all(type(item) is int for item in value):
            parts.append(tuple(value))
        else:
            return None
    return tuple(parts)


def _first(name, comm, algorithm, segment, check, timeout, buffers, key) -> _Repeat:
    """A call past the repeat path: its arguments checked, its plan found or made; kept for its repeats
    under `key` (unless None, or the call makes a new result)."""
    with refusing(comm):
        check_comm(comm, name)
        check_options(name, comm, algorithm, segment, check)
        call = prepared(name, comm, *buffers)
        try:
            current = settings.current()
        except settings.SettingError as error:
            raise settings.SettingError(f"ringtree {name} on rank {comm.Get_rank()}: {error}") from None
        timeout = checked_timeout(timeout, comm, current.timeout)
        state = comm_state(comm, timeout)
    state.check_usable()
    op = call.reduce_op.value if call.reduce_op is not None else None
    dtype = call.source.dtype  # the target's too: collective_args makes them one
    collective = call.collective
    # MPI's own is a candidate for untimed calls only: a wait inside it does not keep a timeout.
    native_ok = (timeout is None and call.backend is NumpyBackend
                 and (call.reduce_op is None or reduces(dtype, call.reduce_op)))
    choice = choose(name, call.count * dtype.itemsize, state.size, algorithm, segment, native_ok)
    compared = current.check if check is None else check
    # Ranks that differ on the root may each send and none receive: a wrong result that no message
    # shows. So a rooted call compares its arguments first unless the caller says check=False, or
    # runs where every rank sees every rank's root (a small broadcast of MPI's own).
    showing_roots = (name == "broadcast" and check is None and not compared and choice.algorithm == NATIVE
                     and call.count * dtype.itemsize <= ROOTS_SHOWN_MAX)
    if showing_roots:
        collective = collective._replace(root=None)  # one plan for every root, which the call checks
    sign = signature(call.count, dtype, op, algorithm, segment, name, collective.root, collective.counts or None)
    comparison = None
    if compared or (sign.root is not None and check is None):
        described = name + (f" root {sign.root}" if sign.root is not None else "") + (
            f" blocks {list(sign.blocks)}" if sign.blocks else "")
        fields = (call.count, dtype, f"{op}", algorithm, described)
        comparison = (agreement.call_record(*fields), fields, agreement.agreement_described(state, fields))
    repeat = _Repeat((comm, *buffers), (), call, state, sign, dtype, None, None, None,
                     f"{name} on rank {state.rank} of {state.name} ({sign.described()})", timeout, comparison,
                     call.after)
    if comparison is not None:
        _agree(repeat)  # before the plan: making a native one is a collective
    plan_key = (collective, call.backend, algorithm, call.count, dtype, call.reduce_op, segment, native_ok)
    plan = state.plans.get(plan_key)
    if plan is None:
        log.info("%s %d B %s on %d ranks: %s, segment %s, from %s", name, call.count * dtype.itemsize, dtype,
                 state.size, choice.algorithm, f"{choice.segment} B" if choice.segment else "none", choice.source)
        plan = state.plans[plan_key] = build_plan(state, call.backend, choice, collective, call.count, dtype,
                                             call.reduce_op, sign, segment)
    written = tuple(value for value in buffers if type(value) is np.ndarray and value is call.result)
    native, after = None, call.after
    if showing_roots:
        native, after = broadcast_showing_roots(state, call.target, call.collective.root)
    elif type(plan) is NativePlan:
        native = _native_start(call, plan.op)
    steps = None
    if type(plan) is Plan and plan.bound is not None and timeout is None:  # stepwise waits keep none
        compiled_steps = plan.compiled.in_place_steps if call.inplace else plan.compiled.steps
        steps = steps_runner(plan, state, bound_steps(compiled_steps, [call.source, call.target,
                                                                       *plan.stepwise_scratch], state.remote), call.target)
    repeat = repeat._replace(written=written, plan=plan, native=native, steps=steps, after=after)
    if key is not None and (call.result is None or written):
        if len(REPEATS) >= REPEATS_MAX:
            REPEATS.clear()
        REPEATS[key] = repeat
    return repeat


def _agree(repeat: _Repeat) -> None:
    """The call's comparison (check mode, a rooted call): MismatchError on every rank unless every rank
    makes it with the same arguments."""
    record, described, what = repeat.comparison
    agreement.agree(repeat.state, record, described, repeat.signature, repeat.timeout, not THREADED[1], what)


def _start(call: Prepared, state, repeat: _Repeat, timeout) -> Request:
    plan = repeat.plan
    if repeat.native is not None:
        native = NativeInFlight(plan, state, call.source, call.target, call.inplace, None, repeat.what,
                                repeat.native)
        return Request(native, call.result, repeat.after)
    return Request(plan.start(state, call.source, call.target, call.inplace, timeout), call.result, repeat.after)


def _native_start(call: Prepared, op):
    """MPI's own nonblocking collective of the call, as a function of the communicator to start it on:
    its arguments made once, here, for every call of the repeat."""
    collective, source, target = call.collective, call.source, call.target
    name, root, counts = collective.name, collective.root, list(collective.counts)
    if name == "reduce_scatter":  # Ireduce_scatter: under MPICH faster than Ireduce_scatter_block
        return lambda comm: comm.Ireduce_scatter(source, target, counts, op)
    if name == "reduce":
        sendbuf = MPI.IN_PLACE if call.inplace else source
        return lambda comm: comm.Ireduce(sendbuf, target if target.size or not source.size else None, op, root)
    # These reduce nothing: any dtype goes, as bytes where MPI has no datatype of it.
    whole, mine = _typed(target), _typed(source)
    if name == "broadcast":
        return lambda comm: comm.Ibcast(whole, root)
    sendbuf = MPI.IN_PLACE if call.inplace else mine
    if len(set(counts)) == 1:
        return lambda comm: comm.Iallgather(sendbuf, whole)
    if isinstance(whole, list):
        recvbuf = [whole[0], [c * target.dtype.itemsize for c in counts], None, MPI.BYTE]
    else:
        recvbuf = [whole, counts, None, dtlib.from_numpy_dtype(target.dtype)]
    return lambda comm: comm.Iallgatherv(sendbuf, recvbuf)


def _typed(array):
    """`array` as MPI takes it: itself where every MPI has its dtype, else its bytes."""
    return array if array.dtype.isnative and array.dtype.char in "?bBhHiIlLqQfdFD" else [array.view(np.uint8), MPI.BYTE]


named_defaults(reduce_scatter, ireduce_scatter, reduce_scatter_init, reduce, ireduce, reduce_init)
