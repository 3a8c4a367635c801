"""The other collectives: `reduce_scatter`, `allgather`, `broadcast`, `reduce` and `alltoall`, and
their nonblocking and persistent forms, in the style of `allreduce` (and of mpi4py's Reduce_scatter,
Allgatherv, Bcast, Reduce and Alltoall).

Each is a line over the one path of every collective (call_path.py), after a look for its run bound
to the same small arrays (again.kept_runs), as allreduce's: the same checks, plans, engine, mismatch
detection, timeouts and thread rules as allreduce; `auto` chooses among their algorithms and MPI's
own (tuning/collectives.py).
"""

from __future__ import annotations

from functools import partial

from mpi4py import MPI

from ..ops import named_defaults
from ..runtime.checks.refusal import refusing
from ..runtime.session.again import MISSED, kept_runs
from ..runtime.session.one_caller import in_call
from ..runtime.session.state import SESSIONS
from .call_path import run
from .checks import checked_timeout
from .collective_args import checked_call, with_count_matrix
from .persistent import PersistentRequest, started
from .request import Request

__all__ = ["reduce_scatter", "ireduce_scatter", "reduce_scatter_init", "allgather", "iallgather", "allgather_init",
           "broadcast", "ibroadcast", "broadcast_init", "reduce", "ireduce", "reduce_init", "alltoall", "ialltoall",
           "alltoall_init"]

_OPTIONS = """`algorithm` is "auto", "native" (MPI's own) or one of ringtree.algorithms.GENERATORS[collective]; `segment`
    (bytes) overrides the pipeline's segment size; `check` and `timeout` are as for allreduce."""


def reduce_scatter(sendbuf, recvbuf=None, counts=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None,
                   check=None, timeout=None):
    """Combine `sendbuf` from every rank of `comm` with `op`; rank r gets block r of the result.

    `sendbuf` holds every rank's block, in rank order, block r of `counts[r]` elements (default:
    equal blocks, which must divide it). With sendbuf MPI.IN_PLACE, recvbuf holds the input and gets
    the block at its start. The block goes into `recvbuf` (a new array when None), which is returned.
    """
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs; recvbuf None: kept by its shape
    again = (last[1] if comm is last[0] else kept_runs(comm))["reduce_scatter"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        ran = again.ran(sendbuf, counts, op, comm, algorithm)
        if ran is not MISSED:
            return ran
    return run("reduce_scatter", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, counts, op)


def ireduce_scatter(sendbuf, recvbuf=None, counts=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None,
                    check=None, timeout=None) -> Request:
    """Start a reduce_scatter and return its Request (wait() returns the block)."""
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs
    again = (last[1] if comm is last[0] else kept_runs(comm))["ireduce_scatter"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        request = again.ran(sendbuf, counts, op, comm, algorithm)
        if request is not MISSED:
            return request
    return run("reduce_scatter", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, counts, op)


def allgather(sendbuf, recvbuf=None, counts=None, *, comm=None, algorithm="auto", segment=None, check=None,
              timeout=None):
    """Every rank of `comm` gets every rank's `sendbuf`, in rank order, in `recvbuf`, which is returned.

    `counts[r]` is rank r's number of elements (default: every rank's is sendbuf's). With sendbuf
    MPI.IN_PLACE, this rank's block is already in place in recvbuf. A new recvbuf (for None) has
    shape (ranks, *sendbuf.shape) where no counts are given, else is 1-D.
    """
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs; recvbuf None: kept by its shape
    again = (last[1] if comm is last[0] else kept_runs(comm))["allgather"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        ran = again.ran(sendbuf, counts, None, comm, algorithm)
        if ran is not MISSED:
            return ran
    return run("allgather", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, counts)


def iallgather(sendbuf, recvbuf=None, counts=None, *, comm=None, algorithm="auto", segment=None, check=None,
               timeout=None) -> Request:
    """Start an allgather and return its Request (wait() returns recvbuf)."""
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs
    again = (last[1] if comm is last[0] else kept_runs(comm))["iallgather"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        request = again.ran(sendbuf, counts, None, comm, algorithm)
        if request is not MISSED:
            return request
    return run("allgather", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, counts)


def broadcast(buf, root=0, *, comm=None, algorithm="auto", segment=None, check=None, timeout=None):
    """Every rank of `comm` gets rank `root`'s `buf` in its own `buf`, which is returned."""
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs
    kept = (last[1] if comm is last[0] else kept_runs(comm))["broadcast"]
    if segment is check is timeout is None:
        again = kept.get(id(buf))
        if again is not None and again.ran(root, None, None, comm, algorithm) is not MISSED:
            return buf
        again = kept.get(id(None))  # a new buffer each call: its shape's run
        if again is not None and again.ran(buf, root, None, comm, algorithm) is not MISSED:
            return buf
    return run("broadcast", True, comm, algorithm, segment, check, timeout, buf, root)


def ibroadcast(buf, root=0, *, comm=None, algorithm="auto", segment=None, check=None, timeout=None) -> Request:
    """Start a broadcast and return its Request (wait() returns buf)."""
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs
    again = (last[1] if comm is last[0] else kept_runs(comm))["ibroadcast"].get(id(buf))
    if again is not None and segment is check is timeout is None:
        request = again.ran(root, None, None, comm, algorithm)
        if request is not MISSED:
            return request
    return run("broadcast", False, comm, algorithm, segment, check, timeout, buf, root)


def reduce(sendbuf, recvbuf=None, op=MPI.SUM, root=0, *, comm=None, algorithm="auto", segment=None, check=None,
           timeout=None):
    """Combine `sendbuf` from every rank of `comm` with `op` into the root's `recvbuf` (a new array
    when None), which the root gets back; the other ranks get None (their recvbuf is not looked at).
    With sendbuf MPI.IN_PLACE, the root's recvbuf holds its input."""
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs; recvbuf None: kept by its shape
    again = (last[1] if comm is last[0] else kept_runs(comm))["reduce"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        ran = again.ran(sendbuf, op, root, comm, algorithm)
        if ran is not MISSED:
            return ran
    return run("reduce", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op, root)


def ireduce(sendbuf, recvbuf=None, op=MPI.SUM, root=0, *, comm=None, algorithm="auto", segment=None, check=None,
            timeout=None) -> Request:
    """Start a reduce and return its Request (wait() returns the result at the root, else None)."""
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs
    again = (last[1] if comm is last[0] else kept_runs(comm))["ireduce"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        request = again.ran(sendbuf, op, root, comm, algorithm)
        if request is not MISSED:
            return request
    return run("reduce", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op, root)


def alltoall(sendbuf, recvbuf=None, sendcounts=None, recvcounts=None, *, comm=None, algorithm="auto", segment=None,
             check=None, timeout=None):
    """Rank r's `sendbuf` is N equal blocks, block d for rank d; rank d gets them in `recvbuf` (a new
    array when None), block r from rank r, and it is returned. With sendbuf MPI.IN_PLACE, recvbuf
    holds the input and gets the result.

    Given counts, as MPI's Alltoallv with the blocks end to end: rank r sends `sendcounts[d]`
    elements to rank d and receives `recvcounts[s]` from rank s (in place, recvcounts are both).
    The ranks exchange their counts first (a small allreduce of N×N of them), and raise
    MismatchError on every rank where what one sends another is not what that one expects."""
    if sendcounts is not None or recvcounts is not None:
        return run("alltoall", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, sendcounts, recvcounts)
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs; recvbuf None: kept by its shape
    again = (last[1] if comm is last[0] else kept_runs(comm))["alltoall"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        ran = again.ran(sendbuf, None, None, comm, algorithm)
        if ran is not MISSED:
            return ran
    return run("alltoall", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf)


def ialltoall(sendbuf, recvbuf=None, sendcounts=None, recvcounts=None, *, comm=None, algorithm="auto", segment=None,
              check=None, timeout=None) -> Request:
    """Start an alltoall and return its Request (wait() returns recvbuf). Given counts, the exchange of
    counts is waited for before it returns: every rank must make the call (unlike MPI's Ialltoallv)."""
    if sendcounts is not None or recvcounts is not None:
        return run("alltoall", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, sendcounts, recvcounts)
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs
    again = (last[1] if comm is last[0] else kept_runs(comm))["ialltoall"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        request = again.ran(sendbuf, None, None, comm, algorithm)
        if request is not MISSED:
            return request
    return run("alltoall", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf)


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


def alltoall_init(sendbuf, recvbuf, sendcounts=None, recvcounts=None, *, comm=None, algorithm="auto", check=None,
                  timeout=None) -> PersistentRequest:
    """A persistent alltoall of these buffers; given counts, the ranks exchange and compare them here, once."""
    if sendcounts is None and recvcounts is None:
        return _persistent("alltoall", comm, algorithm, check, timeout, sendbuf, recvbuf)
    comm = MPI.COMM_WORLD if comm is None else comm
    if recvbuf is None:  # before the exchange of counts, which the other ranks would wait in
        with refusing(comm):
            raise ValueError(f"ringtree alltoall_init on rank {comm.Get_rank()}: a persistent alltoall needs "
                             "recvbuf: the result goes there at every Wait")
    exchanged = in_call(comm, with_count_matrix, comm, algorithm, None, check, timeout,
                        (sendbuf, recvbuf, sendcounts, recvcounts))
    return _persistent("alltoall", comm, algorithm, check, timeout, *exchanged)


for _function in (reduce_scatter, allgather, broadcast, reduce, alltoall):
    _function.__doc__ += "\n    " + _OPTIONS + "\n"


def _persistent(name, comm, algorithm, check, timeout, *buffers) -> PersistentRequest:
    """The arguments checked once, here; every Start starts the nonblocking call of them (started)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    with refusing(comm):
        call = checked_call(name, comm, algorithm, None, check, *buffers)
        kind = call.collective.kind  # a result at every rank, or a reduce's at its root
        needs = kind.blocks or (kind.rooted and kind.reduces and comm.Get_rank() == call.collective.root)
        if needs and buffers[1] is None:
            raise ValueError(f"ringtree {name}_init on rank {comm.Get_rank()}: a persistent {name} needs recvbuf: "
                             "the result goes there at every Wait")
        checked_timeout(timeout, comm, None, name)
    return PersistentRequest(partial(started, name, comm, algorithm, check, timeout, buffers), name)


named_defaults(reduce_scatter, ireduce_scatter, reduce_scatter_init, reduce, ireduce, reduce_init)
