"""A call's arguments, checked on the calling rank before any message is sent: bad input raises
TypeError or ValueError naming the rank, and leaves the buffers untouched."""

from __future__ import annotations

import numbers

import numpy as np
from mpi4py import MPI

from .algorithms import ALGORITHMS, GENERATORS
from .ops import check_dtype, parse_op
from .runtime.backend import NoDevice, NumpyBackend, backend_for

__all__ = ["check_comm", "check_options", "checked", "checked_timeout"]


def check_comm(comm, name: str = "allreduce") -> None:
    """A TypeError unless `comm` is an intracommunicator that can be used: one that was freed says so."""
    if isinstance(comm, MPI.Intracomm) and comm != MPI.COMM_NULL:
        return
    if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
        raise TypeError(f"ringtree {name}: comm must be an intracommunicator, got a null one: it was freed, or it is "
                        "MPI.COMM_NULL (as Split gives a rank of color MPI.UNDEFINED)")
    raise TypeError(f"ringtree {name}: comm must be an intracommunicator, got {comm!r}")


def check_options(name: str, comm, algorithm, segment, check) -> None:
    """The options of a call of collective `name` other than allreduce, checked."""
    known = GENERATORS[name]
    error = None
    if algorithm != "auto" and algorithm not in known:
        error = ValueError(f"unknown {name} algorithm {algorithm!r}; use 'auto' or one of {sorted(known)}")
    elif segment is not None and (isinstance(segment, bool) or not isinstance(segment, int) or segment < 1):
        error = ValueError(f"segment must be a positive number of bytes, got {segment!r}")
    elif check is not None and not isinstance(check, bool):
        error = TypeError(f"check must be True, False or None, got {check!r}")
    if error is not None:
        raise type(error)(f"ringtree {name} on rank {comm.Get_rank()}: {error}")


def checked(sendbuf, recvbuf, op, comm, algorithm, segment):
    """Validate the arguments; return (sendbuf, recvbuf or None, ReduceOp, backend, in place?).

    Every call but a repeat (_repeat) runs this, so the common case (numpy arrays, a
    predefined op) takes the fewest steps."""
    check_comm(comm)
    try:
        reduce_op = parse_op(op)
        if algorithm != "auto" and algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; use 'auto' or one of {sorted(ALGORITHMS)}")
        if segment is not None and not (isinstance(segment, numbers.Integral) and segment >= 1):
            raise ValueError(f"segment must be a positive number of bytes, got {segment!r}")
        if sendbuf is MPI.IN_PLACE:
            if recvbuf is None:
                raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold the input, but it is None")
            sendbuf = recvbuf
        backend = NumpyBackend if type(sendbuf) is np.ndarray else _array_backend(sendbuf, "sendbuf")
        if not sendbuf.flags.c_contiguous:
            raise _not_contiguous("sendbuf", sendbuf)
        check_dtype(sendbuf.dtype, reduce_op)
        backend.check(sendbuf, "sendbuf", reduce_op)
        if recvbuf is None:
            return sendbuf, None, reduce_op, backend, False
        if recvbuf is sendbuf:
            inplace = True
        else:
            if type(recvbuf) is not type(sendbuf) and _array_backend(recvbuf, "recvbuf") is not backend:
                raise TypeError(f"sendbuf is a {_type_name(sendbuf)} but recvbuf is a {_type_name(recvbuf)}")
            if not recvbuf.flags.c_contiguous:
                raise _not_contiguous("recvbuf", recvbuf)
            if recvbuf.dtype != sendbuf.dtype:
                raise TypeError(f"sendbuf has dtype {sendbuf.dtype} but recvbuf has dtype {recvbuf.dtype}")
            if recvbuf.size != sendbuf.size:  # as mpi4py: shapes may differ, the memory is what counts
                raise ValueError(f"sendbuf has {sendbuf.size} elements but recvbuf has {recvbuf.size}")
            backend.check(recvbuf, "recvbuf", reduce_op)
            aliasing = backend.aliasing(sendbuf, recvbuf) if sendbuf.size else None
            if aliasing == "overlap":
                raise ValueError("sendbuf and recvbuf overlap without being the same memory; use MPI.IN_PLACE")
            inplace = aliasing == "same"
        if not backend.writeable(recvbuf):
            raise ValueError("recvbuf is read-only")
        return sendbuf, recvbuf, reduce_op, backend, inplace
    except (TypeError, ValueError, NoDevice) as error:
        raise type(error)(f"ringtree allreduce on rank {comm.Get_rank()}: {error}") from None


def checked_timeout(timeout, comm, default):
    if timeout is None:
        return default
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout > 0:
        raise ValueError(f"ringtree allreduce on rank {comm.Get_rank()}: timeout must be a positive number "
                         f"of seconds, got {timeout!r}")
    return float(timeout)


def _array_backend(buf, name):
    backend = backend_for(buf)
    if backend is None:
        raise TypeError(f"{name} must be a numpy or CuPy array, got {_type_name(buf)}")
    return backend


def _type_name(value) -> str:
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _not_contiguous(name, buf) -> ValueError:
    return ValueError(f"{name} is not C-contiguous (strides {buf.strides} for shape {buf.shape}); "
                      "pass a contiguous copy, e.g. numpy.ascontiguousarray")
