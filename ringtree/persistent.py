"""Persistent collectives: `allreduce_init` (mpi4py's `Allreduce_init` on ringtree), and the
PersistentRequest that the other collectives' `…_init` return too."""

from __future__ import annotations

from mpi4py import MPI

from .allreduce import iallreduce
from .buffers import converted, is_plain_call, passes_through
from .checks import checked, checked_timeout
from .ops import named_defaults
from .runtime.backend import NoDevice
from .runtime.refusal import refusing

__all__ = ["PersistentRequest", "allreduce_init"]


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
    checked(call.send, call.recv, op, comm, algorithm, None)
    checked_timeout(timeout, comm, None)

    def start():
        with call.context:
            return iallreduce(call.send, call.recv, op, comm=comm, algorithm=algorithm, check=check, timeout=timeout)
    return PersistentRequest(start)


class PersistentRequest:
    """A persistent collective (allreduce_init and the like): inactive until Start, active until Wait
    or a Test that says it is done; mpi4py's names and its lowercase ones. `start()` starts a call
    of it and returns its Request."""

    __slots__ = ("_start", "_name", "_active", "_freed")

    def __init__(self, start, name: str = "allreduce") -> None:
        self._start, self._name = start, name
        self._active = None  # the Request of the call started, while one is
        self._freed = False

    def Start(self) -> None:
        if self._freed:
            raise ValueError(f"ringtree persistent {self._name}: Start after Free")
        if self._active is not None:
            raise ValueError(f"ringtree persistent {self._name}: Start while the call started before is active; "
                             "Wait for it first")
        self._active = self._start()

    def Wait(self, status: MPI.Status | None = None) -> bool:
        """Wait for the call started (at once if none is); the result is in recvbuf."""
        if self._active is not None:
            self._active.Wait(status)
            self._active = None
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        if self._active is not None and self._active.Test(status):
            self._active = None
        return self._active is None

    def Free(self) -> None:
        if self._active is not None:
            raise ValueError(f"ringtree persistent {self._name}: Free while a call is active; Wait for it first")
        self._freed = True

    start, wait, test, free = Start, Wait, Test, Free

    def __bool__(self) -> bool:
        """False once freed, as an mpi4py request that is REQUEST_NULL."""
        return not self._freed


named_defaults(allreduce_init)
