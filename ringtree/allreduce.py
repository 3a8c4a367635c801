"""The public allreduce: `allreduce` and `iallreduce`, in the style of mpi4py, over the one path of
every collective (call_path.py). A blocking call repeated on the same small arrays first looks for its
run bound to them (again.AGAIN).

Arguments are checked on the calling rank before any message is sent, so bad
input raises TypeError or ValueError and leaves the buffers untouched.
"""

from __future__ import annotations

from mpi4py import MPI

from .call_path import run
from .ops import named_defaults
from .request import Request
from .runtime.again import AGAIN
from .runtime.in_flight import IN_FLIGHT
from .runtime.one_caller import intruded, one_caller
from .runtime.small import confirm_end
from .runtime.stalls import WAITING, watched
from .runtime.threads import FIRST_IN, THREADED, get_ident

__all__ = ["allreduce", "iallreduce", "Request"]


def allreduce(sendbuf, recvbuf=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None, check=None,
              timeout=None):
    """Combine `sendbuf` from every rank of `comm` with `op`; every rank gets the result.

    `sendbuf` is a C-contiguous array, or MPI.IN_PLACE with the input in
    `recvbuf`. The result goes into `recvbuf` (a new array when None), which is
    returned. `algorithm` is "auto" or a name from ringtree.algorithms.ALGORITHMS;
    `segment` (bytes) overrides the pipeline's segment size. `check=True`
    (default: RINGTREE_CHECK) makes the ranks agree on the call's arguments
    first and raise MismatchError if they differ; `timeout` (seconds, default:
    RINGTREE_TIMEOUT) raises TimeoutError when the collective makes no progress
    for that long. Both must be the same on every rank.
    """
    again = AGAIN.get(id(recvbuf))
    if (again is not None and sendbuf is again.sendbuf and op is again.op and algorithm is again.algorithm
            and comm is again.comm and segment is check is timeout is None and again.thread == get_ident()
            and again.state.broken is None and recvbuf.flags.writeable and recvbuf.dtype is again.dtype
            and (again.inplace or sendbuf.dtype is again.dtype)
            and (again.native or not (IN_FLIGHT.requests or IN_FLIGHT.queued))):
        if THREADED[1]:
            return one_caller(comm, _watched_again, again, recvbuf, confirm=confirm_end)
        outer, FIRST_IN[0] = FIRST_IN[0], again.handle  # as one_caller.in_call marks the first thread's call
        WAITING[0] = again  # for the stall watchdog (runtime/stalls.py): watched, inlined
        try:
            if THREADED[1]:  # THREADED read again: a second thread has called since
                one_caller(comm, again.run, confirm=confirm_end)
            else:
                again.run()
        finally:
            FIRST_IN[0], WAITING[0] = outer, None
            WAITING[1] += 1
        if FIRST_IN[1] is not None:
            intruded()
        return recvbuf
    return run("allreduce", True, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op)


def _watched_again(again, recvbuf):
    watched(again.run, again.call)
    return recvbuf


def iallreduce(sendbuf, recvbuf=None, op=MPI.SUM, *, comm=None, algorithm="auto", segment=None, check=None,
               timeout=None) -> Request:
    """Start an allreduce and return its Request; arguments as for `allreduce` (the timeout applies to
    waiting on it; in check mode, the ranks agree before this returns)."""
    return run("allreduce", False, comm, algorithm, segment, check, timeout, sendbuf, recvbuf, op)


named_defaults(allreduce, iallreduce)
