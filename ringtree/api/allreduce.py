"""The public allreduce: `allreduce` and `iallreduce`, in the style of mpi4py, over the one path of
every collective (call_path.py). A call repeated on the same small arrays first looks for its run (or
start) bound to them (again.kept_runs), as every collective's public function does.

Arguments are checked on the calling rank before any message is sent, so bad
input raises TypeError or ValueError and leaves the buffers untouched.
"""

from __future__ import annotations

from mpi4py import MPI

from ..ops import named_defaults
from ..runtime.session.again import MISSED, kept_runs
from ..runtime.session.state import SESSIONS
from .call_path import run
from .request import Request

__all__ = ["allreduce", "iallreduce", "Request"]


def allreduce(sendbuf, recvbuf=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None, check=None,
              timeout=None):
    """Combine `sendbuf` from every rank of `comm` with `op`; every rank gets the result.

    `sendbuf` is a contiguous array, C- or Fortran-ordered (numpy, CuPy, a torch
    tensor), or any other buffer mpi4py's Allreduce takes (docs/buffers.md); or
    MPI.IN_PLACE (or None) with the input in `recvbuf`. The result goes into
    `recvbuf`, which is returned; when None, into a new array of a numpy sendbuf's
    shape and order (a new tensor for a tensor). `algorithm` is "auto", "native" (MPI's
    own) or a name from ringtree.algorithms.ALGORITHMS; `segment` (bytes) overrides the
    pipeline's segment size. `check=True` (default: RINGTREE_CHECK) makes the
    ranks agree on the call's arguments first and raise MismatchError if they
    differ; `timeout` (seconds, default: RINGTREE_TIMEOUT) raises TimeoutError
    when the collective makes no progress for that long. Both must be the same
    on every rank.
    """
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs; recvbuf None: kept by its shape
    again = (last[1] if comm is last[0] else kept_runs(comm))["allreduce"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        ran = again.ran(sendbuf, op, None, comm, algorithm)
        if ran is not MISSED:
            return ran
    return run("allreduce", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op)


def iallreduce(sendbuf, recvbuf=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None, check=None,
               timeout=None) -> Request:
    """Start an allreduce and return its Request; arguments as for `allreduce` (the timeout applies to
    waiting on it; in check mode, the ranks agree before this returns)."""
    last = SESSIONS.kept  # a loop on one communicator skips kept_runs
    again = (last[1] if comm is last[0] else kept_runs(comm))["iallreduce"].get(id(recvbuf))
    if again is not None and segment is check is timeout is None:
        request = again.ran(sendbuf, op, None, comm, algorithm)
        if request is not MISSED:
            return request
    return run("allreduce", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op)


named_defaults(allreduce, iallreduce)
