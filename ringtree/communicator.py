"""`Communicator`: an mpi4py intracommunicator whose Allreduce, Iallreduce and Allreduce_init run on ringtree."""

from __future__ import annotations

from mpi4py import MPI

from .allreduce import allreduce, iallreduce
from .persistent import PersistentRequest, allreduce_init
from .request import MPIRequest, Request

__all__ = ["Communicator"]


class Communicator(MPI.Intracomm):
    """An `MPI.Intracomm` (the same communicator, not a copy) whose allreduces run on ringtree.

    Usable wherever mpi4py takes a communicator; every other method is mpi4py's own, and the
    communicators that Dup, Clone, Split, Create, Create_group and Split_type make are wrapped
    too. The buffers are whatever mpi4py's Allreduce takes (buffers.py); what ringtree does not
    reduce (a user-defined op, MAXLOC, a derived datatype) goes to MPI's own. `check` and `timeout`
    apply to every call (as allreduce's arguments of those names; None: RINGTREE_CHECK,
    RINGTREE_TIMEOUT) and pass to the communicators made from this one.
    """

    check: bool | None = None
    timeout: float | None = None

    def __new__(cls, comm: MPI.Intracomm | None = None, *, check: bool | None = None,
                timeout: float | None = None) -> Communicator:
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"ringtree.Communicator needs an intracommunicator, got {comm!r}")
        self = super().__new__(cls, comm)
        self.check, self.timeout = check, timeout
        return self

    def __init__(self, comm=None, *, check=None, timeout=None) -> None:
        """All done in __new__: mpi4py's own constructors of a subclass (Dup's) never call __init__."""

    @property
    def comm(self) -> MPI.Intracomm:
        """The same communicator as a plain mpi4py one."""
        return MPI.Intracomm(self)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto") -> None:
        allreduce(sendbuf, recvbuf, op, comm=self, algorithm=algorithm, check=self.check, timeout=self.timeout)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto") -> MPIRequest | Request:
        """An mpi4py request (MPIRequest), which MPI.Request.Waitall and the like take, where MPI lets
        a thread progress it meanwhile (MPI_THREAD_MULTIPLE); else ringtree's Request."""
        request = iallreduce(sendbuf, recvbuf, op, comm=self, algorithm=algorithm, check=self.check,
                             timeout=self.timeout)
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            return request
        return MPIRequest(request)

    def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL, *,
                       algorithm="auto") -> PersistentRequest:
        return allreduce_init(sendbuf, recvbuf, op, comm=self, algorithm=algorithm, check=self.check,
                              timeout=self.timeout)

    def _wrapped(self, comm):
        if not comm:  # COMM_NULL: Split's answer to a rank of color UNDEFINED
            return comm
        return Communicator(comm, check=self.check, timeout=self.timeout)

    def Dup(self, info=None) -> Communicator:
        return self._wrapped(super().Dup(info))

    def Clone(self) -> Communicator:
        return self._wrapped(super().Clone())

    def Split(self, color=0, key=0) -> Communicator:
        return self._wrapped(super().Split(color, key))

    def Split_type(self, split_type, key=0, info=MPI.INFO_NULL) -> Communicator:
        return self._wrapped(super().Split_type(split_type, key, info))

    def Create(self, group) -> Communicator:
        return self._wrapped(super().Create(group))

    def Create_group(self, group, tag=0) -> Communicator:
        return self._wrapped(super().Create_group(group, tag))

    def __repr__(self) -> str:
        return f"ringtree.Communicator({MPI.Intracomm(self)!r})"
