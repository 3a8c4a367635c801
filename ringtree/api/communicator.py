"""`Communicator`: an mpi4py intracommunicator whose Allreduce, Reduce_scatter_block, Reduce_scatter,
Allgather, Allgatherv, Bcast, Reduce and Alltoall (and their I… and …_init forms) run on ringtree."""

from __future__ import annotations

from mpi4py import MPI

from ..ops import named_defaults
from ..runtime.checks.refusal import refusing
from . import collectives
from .allreduce import allreduce, iallreduce
from .converted import passed_through
from .mpi_style import translated
from .persistent import PersistentRequest, allreduce_init
from .request import MPIRequest, Request

__all__ = ["Communicator"]

# ringtree's function of each form of each collective
_FORMS = {name: {"blocking": getattr(collectives, name), "nonblocking": getattr(collectives, "i" + name),
                 "persistent": getattr(collectives, name + "_init")}
          for name in ("reduce_scatter", "allgather", "broadcast", "reduce", "alltoall")}


class Communicator(MPI.Intracomm):
    """An `MPI.Intracomm` (the same communicator, not a copy) whose allreduces, reduce-scatters,
    allgathers, broadcasts, reduces and alltoalls (Alltoallv too) run on ringtree (the rest: mpi4py's).

    Usable wherever mpi4py takes a communicator; every other method is mpi4py's own, and the
    communicators that Dup, Clone, Split, Create, Create_group and Split_type make are wrapped
    too. The buffers are whatever mpi4py's methods take (buffers.py); what ringtree does not
    compute (a user-defined op, MAXLOC, a derived datatype, Allgatherv's or Alltoallv's displacements with gaps)
    goes to MPI's own. `check` and `timeout` apply to every call (as allreduce's arguments of those
    names; None: RINGTREE_CHECK, RINGTREE_TIMEOUT) and pass to the communicators made from this one.
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

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto") -> None:
        self._call("blocking", "Reduce_scatter_block", algorithm, sendbuf, recvbuf, op)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto") -> MPIRequest | Request:
        return self._call("nonblocking", "Reduce_scatter_block", algorithm, sendbuf, recvbuf, op)

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL, *,
                                  algorithm="auto") -> PersistentRequest:
        return self._call("persistent", "Reduce_scatter_block", algorithm, sendbuf, recvbuf, op)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM, *, algorithm="auto") -> None:
        self._call("blocking", "Reduce_scatter", algorithm, sendbuf, recvbuf, recvcounts, op)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM, *,
                        algorithm="auto") -> MPIRequest | Request:
        return self._call("nonblocking", "Reduce_scatter", algorithm, sendbuf, recvbuf, recvcounts, op)

    def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM, info=MPI.INFO_NULL, *,
                            algorithm="auto") -> PersistentRequest:
        return self._call("persistent", "Reduce_scatter", algorithm, sendbuf, recvbuf, recvcounts, op)

    def Allgather(self, sendbuf, recvbuf, *, algorithm="auto") -> None:
        self._call("blocking", "Allgather", algorithm, sendbuf, recvbuf)

    def Iallgather(self, sendbuf, recvbuf, *, algorithm="auto") -> MPIRequest | Request:
        return self._call("nonblocking", "Allgather", algorithm, sendbuf, recvbuf)

    def Allgather_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *, algorithm="auto") -> PersistentRequest:
        return self._call("persistent", "Allgather", algorithm, sendbuf, recvbuf)

    def Allgatherv(self, sendbuf, recvbuf, *, algorithm="auto") -> None:
        self._call("blocking", "Allgatherv", algorithm, sendbuf, recvbuf)

    def Iallgatherv(self, sendbuf, recvbuf, *, algorithm="auto") -> MPIRequest | Request:
        return self._call("nonblocking", "Allgatherv", algorithm, sendbuf, recvbuf)

    def Allgatherv_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *, algorithm="auto") -> PersistentRequest:
        return self._call("persistent", "Allgatherv", algorithm, sendbuf, recvbuf)

    def Bcast(self, buf, root=0, *, algorithm="auto") -> None:
        self._call("blocking", "Bcast", algorithm, buf, root)

    def Ibcast(self, buf, root=0, *, algorithm="auto") -> MPIRequest | Request:
        return self._call("nonblocking", "Bcast", algorithm, buf, root)

    def Bcast_init(self, buf, root=0, info=MPI.INFO_NULL, *, algorithm="auto") -> PersistentRequest:
        return self._call("persistent", "Bcast", algorithm, buf, root)

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, *, algorithm="auto") -> None:
        self._call("blocking", "Reduce", algorithm, sendbuf, recvbuf, op, root)

    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, *, algorithm="auto") -> MPIRequest | Request:
        return self._call("nonblocking", "Reduce", algorithm, sendbuf, recvbuf, op, root)

    def Reduce_init(self, sendbuf, recvbuf, op=MPI.SUM, root=0, info=MPI.INFO_NULL, *,
                    algorithm="auto") -> PersistentRequest:
        return self._call("persistent", "Reduce", algorithm, sendbuf, recvbuf, op, root)

    def Alltoall(self, sendbuf, recvbuf, *, algorithm="auto") -> None:
        self._call("blocking", "Alltoall", algorithm, sendbuf, recvbuf)

    def Ialltoall(self, sendbuf, recvbuf, *, algorithm="auto") -> MPIRequest | Request:
        return self._call("nonblocking", "Alltoall", algorithm, sendbuf, recvbuf)

    def Alltoall_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *, algorithm="auto") -> PersistentRequest:
        return self._call("persistent", "Alltoall", algorithm, sendbuf, recvbuf)

    def Alltoallv(self, sendbuf, recvbuf, *, algorithm="auto") -> None:
        self._call("blocking", "Alltoallv", algorithm, sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf, recvbuf, *, algorithm="auto") -> MPIRequest | Request:
        return self._call("nonblocking", "Alltoallv", algorithm, sendbuf, recvbuf)

    def Alltoallv_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *, algorithm="auto") -> PersistentRequest:
        return self._call("persistent", "Alltoallv", algorithm, sendbuf, recvbuf)

    def _call(self, form: str, method: str, algorithm: str, *arguments):
        """mpi4py's `method` on ringtree, or MPI's own where ringtree does not compute it, in `form`:
        "blocking" (returns None), "nonblocking" (a request) or "persistent" (a persistent request)."""
        with refusing(self):
            try:
                call = translated(method, self, *arguments)
            except (TypeError, ValueError) as error:
                raise type(error)(f"ringtree {method} on rank {self.Get_rank()}: {error}") from None
        if call.name is None:
            if form == "persistent":  # MPI's own persistent request, on the caller's communicator
                return getattr(MPI.Intracomm, method + "_init")(self, *arguments)
            started = getattr(MPI.Intracomm, "I" + method[0].lower() + method[1:])
            through = passed_through(self, method, algorithm, self.timeout, call.why, arguments,
                                     lambda own: started(own, *arguments), form == "blocking")
            if form == "blocking":
                return None
            request = Request(through, None)
        else:
            run = _FORMS[call.name][form]
            request = run(*call.arguments, comm=self, algorithm=algorithm, check=self.check, timeout=self.timeout)
            if form != "nonblocking":
                return None if form == "blocking" else request
        if form == "blocking":
            request.wait()
            return None
        return request if MPI.Query_thread() < MPI.THREAD_MULTIPLE else MPIRequest(request)

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


named_defaults(*(method for name, method in vars(Communicator).items() if callable(method) and name[0].isupper()))
