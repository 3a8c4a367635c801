"""mpi4py's Reduce_scatter_block, Reduce_scatter, Allgather, Allgatherv, Bcast, Reduce, Alltoall and Alltoallv, as
calls of ringtree's reduce_scatter, allgather, broadcast, reduce and alltoall; or, where ringtree does not compute the
call (a user-defined op, MAXLOC, a derived datatype, displacements with gaps, counts in a block buffer
specification), MPI's own, nonblocking, waited for while ringtree's collectives in flight progress."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..words import counted
from .buffers import as_array, passes_through

__all__ = ["Translated", "translated"]


class Translated(NamedTuple):
    """A drop-in call as ringtree's: the collective and its arguments; or (name None) MPI's own, `why`."""

    name: str | None
    arguments: tuple
    why: str = ""


def translated(method: str, comm, *arguments) -> Translated:
    """The ringtree call (or the reason for MPI's own) of mpi4py's `method` with these arguments."""
    return _TRANSLATIONS[method](comm, *arguments)


def _reduce_scatter_block(comm, sendbuf, recvbuf, op) -> Translated:
    why = passes_through(op, sendbuf, recvbuf) or _counted(sendbuf, recvbuf)
    if why:
        return Translated(None, (), why)
    if sendbuf is MPI.IN_PLACE or sendbuf is None:
        return Translated("reduce_scatter", (MPI.IN_PLACE, recvbuf, None, op))
    mine = as_array(recvbuf, "recvbuf", writable=True).size
    return Translated("reduce_scatter", (sendbuf, recvbuf, (mine,) * comm.Get_size(), op))


def _reduce_scatter(comm, sendbuf, recvbuf, recvcounts, op) -> Translated:
    why = passes_through(op, sendbuf, recvbuf)
    if why:
        return Translated(None, (), why)
    inplace = sendbuf is MPI.IN_PLACE or sendbuf is None
    if recvcounts is None:
        if inplace:
            raise ValueError("Reduce_scatter with MPI.IN_PLACE needs recvcounts: recvbuf holds every block")
        recvcounts = MPI.Intracomm(comm).allgather(as_array(recvbuf, "recvbuf", writable=True).size)  # as mpi4py
    return Translated("reduce_scatter", (MPI.IN_PLACE if inplace else sendbuf, recvbuf, recvcounts, op))


def _allgather(comm, sendbuf, recvbuf) -> Translated:
    why = passes_through(None, sendbuf, recvbuf) or _counted(sendbuf, recvbuf)
    if why:
        return Translated(None, (), why)
    if sendbuf is MPI.IN_PLACE or sendbuf is None:
        return Translated("allgather", (MPI.IN_PLACE, recvbuf, None))
    total = as_array(recvbuf, "recvbuf", writable=True).size
    mine = as_array(sendbuf, "sendbuf", writable=False).size
    if total != mine * comm.Get_size():
        raise ValueError(f"recvbuf has {counted(total, 'element')}, not {comm.Get_size()} blocks of sendbuf's {mine}")
    return Translated("allgather", (sendbuf, recvbuf, None))


def _allgatherv(comm, sendbuf, recvbuf) -> Translated:
    why = passes_through(None, sendbuf, recvbuf)
    if why:
        return Translated(None, (), why)
    spec, counts, displs = _vector(recvbuf, "Allgatherv's recvbuf")
    if not _end_to_end(counts, displs):
        return Translated(None, (), "displacements that do not lay the blocks end to end")
    return Translated("allgather", (MPI.IN_PLACE if sendbuf is None else sendbuf, spec, counts))


def _alltoallv(comm, sendbuf, recvbuf) -> Translated:
    why = passes_through(None, sendbuf, recvbuf)
    if why:
        return Translated(None, (), why)
    inplace = sendbuf is MPI.IN_PLACE or sendbuf is None
    receiving, recvcounts, received_at = _vector(recvbuf, "Alltoallv's recvbuf")
    sending, sendcounts, sent_at = (MPI.IN_PLACE, None, None) if inplace else _vector(sendbuf, "Alltoallv's sendbuf")
    if not (_end_to_end(recvcounts, received_at) and (inplace or _end_to_end(sendcounts, sent_at))):
        return Translated(None, (), "displacements that do not lay the blocks end to end")
    return Translated("alltoall", (sending, receiving, sendcounts, recvcounts))


def _vector(spec, what: str) -> tuple:
    """(the buffer, with its datatype if given; the counts; the displacements or None) of a buffer
    specification with counts, as mpi4py's vector collectives take it."""
    if not isinstance(spec, (list, tuple)) or len(spec) < 2:
        raise TypeError(f"{what} is [buf, counts], [buf, (counts, displs)], [buf, counts, displs] or either of "
                        "those with a datatype last")
    buf, *rest = spec
    datatype = rest.pop() if isinstance(rest[-1], (str, MPI.Datatype)) else None
    counts, displs = (rest[0] if len(rest) == 1 and isinstance(rest[0], tuple) and len(rest[0]) == 2
                      and not np.isscalar(rest[0][0]) else (rest[0], rest[1] if len(rest) > 1 else None))
    return buf if datatype is None else [buf, datatype], [int(c) for c in counts], displs


def _end_to_end(counts, displs) -> bool:
    return displs is None or list(displs) == [sum(counts[:r]) for r in range(len(counts))]


def _bcast(comm, buf, root) -> Translated:
    why = passes_through(None, buf)
    return Translated(None, (), why) if why else Translated("broadcast", (buf, root))


def _reduce(comm, sendbuf, recvbuf, op, root) -> Translated:
    why = passes_through(op, sendbuf, recvbuf)
    return Translated(None, (), why) if why else Translated("reduce", (sendbuf, recvbuf, op, root))


def _alltoall(comm, sendbuf, recvbuf) -> Translated:
    why = passes_through(None, sendbuf, recvbuf) or _counted(sendbuf, recvbuf)
    if why:
        return Translated(None, (), why)
    if sendbuf is MPI.IN_PLACE or sendbuf is None:
        return Translated("alltoall", (MPI.IN_PLACE, recvbuf))
    total = as_array(recvbuf, "recvbuf", writable=True).size
    given = as_array(sendbuf, "sendbuf", writable=False).size
    if total != given:
        raise ValueError(f"recvbuf has {counted(total, 'element')}, not sendbuf's {given}")
    return Translated("alltoall", (sendbuf, recvbuf))


_TRANSLATIONS = {"Reduce_scatter_block": _reduce_scatter_block, "Reduce_scatter": _reduce_scatter,
                 "Allgather": _allgather, "Allgatherv": _allgatherv, "Bcast": _bcast, "Reduce": _reduce,
                 "Alltoall": _alltoall, "Alltoallv": _alltoallv}


def _counted(*specs) -> str:
    """Why MPI's own takes a block collective's buffer specification with a count: mpi4py reads
    such a count per block, which ringtree leaves to it."""
    for spec in specs:
        if isinstance(spec, (list, tuple)) and any(isinstance(item, (int, np.integer, tuple)) for item in spec[1:]):
            return "a buffer specification with a count"
    return ""
