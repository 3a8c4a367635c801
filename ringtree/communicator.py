"""`Communicator`: a drop-in for mpi4py's `Comm.Allreduce`/`Iallreduce` on contiguous data."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from .allreduce import Request, allreduce, iallreduce


class Communicator:
    """Wraps an mpi4py intracommunicator; its Allreduce and Iallreduce run on ringtree.

    Every other attribute is the wrapped communicator's, so `rt.Get_rank()` or
    `rt.Bcast(...)` work as before. `check` and `timeout` apply to every call
    (as allreduce's arguments of those names; None: RINGTREE_CHECK, RINGTREE_TIMEOUT).
    """

    def __init__(self, comm: MPI.Intracomm | None = None, *, check: bool | None = None,
                 timeout: float | None = None) -> None:
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"ringtree.Communicator needs an intracommunicator, got {comm!r}")
        self.comm = comm
        self.check = check
        self.timeout = timeout

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto") -> None:
        allreduce(*self._arrays(sendbuf, recvbuf), op, comm=self.comm, algorithm=algorithm, check=self.check,
                  timeout=self.timeout)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto") -> Request:
        return iallreduce(*self._arrays(sendbuf, recvbuf), op, comm=self.comm, algorithm=algorithm,
                          check=self.check, timeout=self.timeout)

    def _arrays(self, sendbuf, recvbuf):
        """The buffer specifications as arrays, checked against each other."""
        rank = self.comm.Get_rank()
        try:
            recv = as_array(recvbuf, writable=True)
            send = sendbuf if sendbuf is MPI.IN_PLACE else as_array(sendbuf, writable=False)
        except (TypeError, ValueError) as error:
            raise type(error)(f"ringtree Allreduce on rank {rank}: {error}") from None
        if send is not MPI.IN_PLACE and send.size != recv.size:
            raise ValueError(f"ringtree Allreduce on rank {rank}: sendbuf has {send.size} elements "
                             f"but recvbuf has {recv.size}")
        return send, recv

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def __repr__(self) -> str:
        return f"ringtree.Communicator({self.comm!r})"


def as_array(spec, *, writable: bool) -> np.ndarray:
    """A 1-D numpy view of an mpi4py buffer specification.

    Accepts what mpi4py's Allreduce accepts for contiguous data: an array or any
    buffer-protocol object, or a list/tuple `[buf, datatype]`, `[buf, count,
    datatype]`, `[buf, (count, displ), datatype]` or `[buf, count, displ,
    datatype]`, where datatype is a predefined MPI.Datatype or a typecode.
    Non-contiguous arrays are passed through unchanged, for allreduce to reject.
    """
    count = displ = datatype = None
    if isinstance(spec, (list, tuple)):
        if not 2 <= len(spec) <= 4:
            raise TypeError(f"a buffer specification has 2 to 4 items, got {len(spec)}")
        buf, *middle, datatype = spec
        if len(middle) == 2:
            count, displ = middle
        elif middle:
            count, displ = middle[0] if isinstance(middle[0], tuple) else (middle[0], None)
    else:
        buf = spec

    dtype = None if datatype is None else _numpy_dtype(datatype)
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            return buf
        array = buf.reshape(-1)
        if dtype is not None and dtype != array.dtype:
            array = array.view(np.uint8).view(dtype)
    else:
        try:
            view = memoryview(buf)
        except TypeError:
            raise TypeError(f"expected a buffer or an array, got {type(buf).__name__}") from None
        if not view.c_contiguous:
            raise ValueError("the buffer is not contiguous")
        if dtype is None:
            try:
                dtype = np.dtype(view.format.lstrip("@"))
            except TypeError:
                raise TypeError(f"cannot tell the element type of buffer format {view.format!r}; "
                                "give a datatype: [buf, MPI.DOUBLE]") from None
        array = np.frombuffer(view.cast("B"), dtype=dtype)
        if writable and view.readonly:
            raise ValueError("recvbuf is read-only")

    displ = displ or 0
    if count is None:
        count = array.size - displ
    if displ < 0 or count < 0 or displ + count > array.size:
        raise ValueError(f"count {count} at displacement {displ} does not fit a buffer of {array.size} elements")
    return array[displ:displ + count]


def _numpy_dtype(datatype) -> np.dtype:
    unsupported = TypeError(f"unsupported datatype {datatype!r}: ringtree takes predefined MPI datatypes "
                            "and numpy typecodes")
    if isinstance(datatype, MPI.Datatype) and not datatype.is_predefined:
        raise unsupported
    try:
        dtype = np.dtype(datatype) if isinstance(datatype, str) else dtlib.to_numpy_dtype(datatype)
    except (TypeError, ValueError, KeyError):
        raise unsupported from None
    if dtype.fields or dtype.subdtype:
        raise unsupported
    return dtype
