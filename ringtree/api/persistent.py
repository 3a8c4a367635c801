"""Persistent collectives: `allreduce_init` (mpi4py's `Allreduce_init` on ringtree), and the
PersistentRequest that the other collectives' `…_init` return too."""

from __future__ import annotations

from functools import partial

import numpy as np
from mpi4py import MPI

from .. import settings
from ..ops import known_op, named_defaults
from ..runtime.checks.refusal import refusing
from ..runtime.engine.native import NativeInFlight, free_plan, native_plan
from ..runtime.session.again import MISSED, started_again
from ..runtime.session.one_caller import in_call
from ..runtime.transports.backend import NoDevice
from .buffers import converted, is_plain_call, passes_through
from .call_path import run
from .checks import checked_timeout
from .collective_args import checked_call
from .request import empty_status

__all__ = ["PersistentRequest", "allreduce_init", "started"]


def allreduce_init(sendbuf, recvbuf, op=MPI.SUM, *, comm=None, algorithm="auto", check=None, timeout=None):
    """A persistent allreduce of these buffers, as mpi4py's Prequest: `Start()` begins a call,
    `Wait()`/`Test()` end it, `Free()` frees it. The arguments are checked and converted once, here
    (bad ones raise before any message is sent); every Start runs the plan the first one built.
    What ringtree does not reduce gets MPI's own persistent request (`Comm.Allreduce_init`)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    with refusing(comm):
        return _allreduce_init(sendbuf, recvbuf, op, comm, algorithm, check, timeout)


def _allreduce_init(sendbuf, recvbuf, op, comm, algorithm, check, timeout):
    try:
        if passes_through(op, sendbuf, recvbuf) is not None:
            return MPI.Intracomm(comm).Allreduce_init(MPI.IN_PLACE if sendbuf is None else sendbuf, recvbuf, op)
        if recvbuf is None:
            raise ValueError("a persistent allreduce needs recvbuf: the result goes there at every Wait")
        call = converted(sendbuf, recvbuf)
        if is_plain_call(sendbuf, recvbuf):  # the caller's arrays themselves: their calls take the repeat path
            call = call._replace(send=MPI.IN_PLACE if sendbuf is None else sendbuf, recv=recvbuf)
    except (TypeError, ValueError, NoDevice) as error:
        raise type(error)(f"ringtree allreduce_init on rank {comm.Get_rank()}: {error}") from None
    prepared_call = checked_call("allreduce", comm, algorithm, None, check, call.send, call.recv, op)
    checked_timeout(timeout, comm, None)

    def start():
        with call.context:
            return started("allreduce", comm, algorithm, check, timeout, (call.send, call.recv, op))
    source, target, inplace = prepared_call.source, prepared_call.target, prepared_call.inplace
    if (type(target) is not np.ndarray or check is not None or timeout is not None or known_op(op) is None
            or algorithm != "auto"):  # a named algorithm never settles on MPI's own
        return PersistentRequest(start)
    return PersistentRequest(start, bind=partial(_bound_native, source=source, target=target, inplace=inplace,
                                                 reduce_op=prepared_call.reduce_op), comm=comm)


def _bound_native(started, source, target, inplace, reduce_op) -> NativeInFlight | None:
    """After a Start: where its call (`started`, its Request) runs MPI's own allreduce on the plan of its
    shape, not as a trial of online tuning (what every rank's call does alike, at the same Start), MPI's
    own persistent request (Allreduce_init) of these arrays on a native plan of the request's own, made
    here and freed with it, inactive until its restart(); else None, to ask again at the next Start."""
    native = getattr(started, "execution", None)
    # a trial's `then` records its time; an op of none: a call MPI's own computes (passed_through.py)
    if type(native) is not NativeInFlight or native.then is not None or native.own.op is None:
        return None
    state, own = native.state, native.own
    if state.broken is not None or settings.current().check:
        return None
    # Made after the call began: the other ranks may already be in the next call, whose messages
    # the waits must not take for this one's (the call's own number, not state.calls).
    bound = native_plan(reduce_op, own.divide, state, target.size, target.dtype, own.signature, None, native.seq)
    request = bound.comm.Allreduce_init(MPI.IN_PLACE if inplace else source, target, bound.op)
    return NativeInFlight(bound, state, source, target, inplace, None, native.what, persistent=request)


def started(name, comm, algorithm, check, timeout, buffers):
    """A Start's call of collective `name` on `buffers` (its public function's arguments): by the start
    kept for its arrays, as its i-function starts it (again.started_again), else on the one path."""
    if check is timeout is None:
        request = started_again(name, comm, algorithm, buffers)
        if request is not MISSED:
            return request
    return run(name, False, comm, algorithm, None, check, timeout, *buffers)


class PersistentRequest:
    """A persistent collective (allreduce_init and the like): inactive until Start, active until Wait
    or a Test that says it is done; mpi4py's names and its lowercase ones. `start()` starts a call
    of it and returns its Request."""

    __slots__ = ("_start", "_name", "_active", "_freed", "_bind", "_bound", "_comm")

    def __init__(self, start, name: str = "allreduce", bind=None, comm=None) -> None:
        """`bind(request)`, tried after each Start (`request`: the call it started) until it gives one,
        returns an inactive NativeInFlight that runs the calls after (on communicator `comm`), or None."""
        self._start, self._name, self._bind, self._comm = start, name, bind, comm
        self._bound = None
        self._active = None  # the Request (or the bound NativeInFlight) of the call started, while one is
        self._freed = False

    def Start(self) -> None:
        if self._freed:
            raise ValueError(f"ringtree persistent {self._name}: Start after Free")
        if self._active is not None:
            raise ValueError(f"ringtree persistent {self._name}: Start while the call started before is active; "
                             "Wait for it first")
        if self._bound is not None:
            in_call(self._comm, self._bound.restart)  # under the thread rules, as any call
            self._active = self._bound
            return
        self._active = self._start()
        if self._bind is not None:  # a collective (it makes a communicator) under the thread rules, as any call
            self._bound = in_call(self._comm, self._bind, self._active)
            if self._bound is not None:
                self._bind = None

    def Wait(self, status: MPI.Status | None = None) -> bool:
        """Wait for the call started (at once if none is); the result is in recvbuf."""
        if self._active is not None:
            self._active.wait()
            self._active = None
        if status is not None:
            empty_status(status)
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        if self._active is not None and self._active.test():
            self._active = None
        done = self._active is None
        if done and status is not None:
            empty_status(status)
        return done

    def Free(self) -> None:
        if self._active is not None:
            raise ValueError(f"ringtree persistent {self._name}: Free while a call is active; Wait for it first")
        bound = self._bound
        if bound is not None:
            bound.request.Free()
            if bound.state.broken is None:
                free_plan(bound.own)
            self._bound = None
        self._freed = True

    start, wait, test, free = Start, Wait, Test, Free

    def __bool__(self) -> bool:
        """False once freed, as an mpi4py request that is REQUEST_NULL."""
        return not self._freed


named_defaults(allreduce_init)
