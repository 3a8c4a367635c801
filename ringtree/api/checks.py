"""A call's communicator and options, checked on the calling rank before any message is sent (its
buffers: collective_args.py): bad input raises TypeError or ValueError naming the rank."""

from __future__ import annotations

import numbers

from mpi4py import MPI

from ..algorithms import GENERATORS
from ..runtime.engine.native import reduces
from ..runtime.transports.backend import NumpyBackend
from ..schedule.collectives import COLLECTIVES
from ..tuning.online import NATIVE

__all__ = ["check_comm", "check_options", "checked_timeout", "not_native"]


def check_comm(comm, name: str = "allreduce") -> None:
    """A TypeError unless `comm` is an intracommunicator that can be used: one that was freed says so."""
    if isinstance(comm, MPI.Intracomm) and comm != MPI.COMM_NULL:
        return
    if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
        raise TypeError(f"ringtree {name}: comm must be an intracommunicator, got a null one: it was freed, or it is "
                        "MPI.COMM_NULL (as Split gives a rank of color MPI.UNDEFINED)")
    raise TypeError(f"ringtree {name}: comm must be an intracommunicator, got {comm!r}")


def check_options(name: str, comm, algorithm, segment, check) -> None:
    """The options of a call of collective `name`, checked."""
    known = GENERATORS[name]
    error = None
    if algorithm != "auto" and algorithm != NATIVE and algorithm not in known:
        named = f" {name}" if COLLECTIVES[name].named else ""
        error = ValueError(f"unknown{named} algorithm {algorithm!r}; use 'auto', 'native' (MPI's own) or one of "
                           f"{sorted(known)}")
    elif segment is not None and (isinstance(segment, bool) or not isinstance(segment, numbers.Integral) or segment < 1):
        error = ValueError(f"segment must be a positive number of bytes, got {segment!r}")
    elif check is not None and not isinstance(check, bool):
        error = TypeError(f"check must be True, False or None, got {check!r}")
    if error is not None:
        raise type(error)(f"ringtree {name} on rank {comm.Get_rank()}: {error}")


def checked_timeout(timeout, comm, default, name: str = "allreduce"):
    """The call's timeout in seconds: `default` (the setting's) for None; ValueError for another than a
    positive number."""
    if timeout is None:
        return default
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout > 0:
        raise ValueError(f"ringtree {name} on rank {comm.Get_rank()}: timeout must be a positive number "
                         f"of seconds, got {timeout!r}")
    return float(timeout)


def not_native(backend, dtype, reduce_op, timeout) -> str | None:
    """Why MPI's own cannot run a call of these (a candidate of `auto` for the others alone), or None:
    a wait inside it keeps no timeout, and it runs numpy's arrays and the ops every MPI reduces them with."""
    if timeout is not None:
        return "a call with a timeout, which a wait inside MPI's own cannot keep"
    if backend is not NumpyBackend:
        return "a call on device memory"
    if reduce_op is not None and not reduces(dtype, reduce_op):
        return f"{reduce_op.value} on {dtype}, which not every MPI reduces"
    return None
