"""The public allreduce: `allreduce` and `iallreduce`, in the style of mpi4py.

Arguments are checked on the calling rank before any message is sent, so bad
input raises TypeError or ValueError and leaves the buffers untouched.
"""

from __future__ import annotations

from mpi4py import MPI

from .algorithms import ALGORITHMS
from .backend import backend_for
from .comm import comm_state
from .engine import PROGRESS, Execution, compiled
from .ops import check_dtype, parse_op
from .schedule import INPUT, OUTPUT
from .selector import select

__all__ = ["allreduce", "iallreduce", "Request"]


class Request:
    """A collective in flight. `wait()` returns the result array; `test()` says whether it is done."""

    def __init__(self, execution: Execution, result) -> None:
        self._execution = execution
        self._result = result

    def test(self) -> bool:
        if not self._execution.done:
            PROGRESS.poll(block=False)
        return self._execution.done

    def wait(self):
        PROGRESS.wait(self._execution)
        return self._result

    # mpi4py's spelling, for code written against MPI.Request.
    def Test(self) -> bool:
        return self.test()

    def Wait(self) -> bool:
        self.wait()
        return True


def allreduce(sendbuf, recvbuf=None, op=MPI.SUM, *, comm=None, algorithm="auto"):
    """Combine `sendbuf` from every rank of `comm` with `op`; every rank gets the result.

    `sendbuf` is a C-contiguous array, or MPI.IN_PLACE with the input in
    `recvbuf`. The result goes into `recvbuf` (a new array when None), which is
    returned.
    """
    return iallreduce(sendbuf, recvbuf, op, comm=comm, algorithm=algorithm).wait()


def iallreduce(sendbuf, recvbuf=None, op=MPI.SUM, *, comm=None, algorithm="auto") -> Request:
    """Start an allreduce and return its Request; arguments as for `allreduce`."""
    comm = MPI.COMM_WORLD if comm is None else comm
    sendbuf, recvbuf, op, backend = _checked(sendbuf, recvbuf, op, comm, algorithm)
    state = comm_state(comm)
    if recvbuf is None:
        recvbuf = backend.empty_like(sendbuf)
    source, target = sendbuf.reshape(-1), recvbuf.reshape(-1)
    if algorithm == "auto":
        algorithm = select(target.nbytes, state.size)
    plan = compiled(algorithm, state.size, state.rank, target.size)
    buffers = {INPUT: source, OUTPUT: target}
    for name, size in plan.schedule.scratch:
        buffers[name] = backend.empty(size, target.dtype)
    execution = Execution(plan, buffers, backend, backend.reducer(op), state.comm, state.next_tag(),
                          finish=lambda: backend.finish(target, op, state.size))
    return Request(execution, recvbuf)


def _checked(sendbuf, recvbuf, op, comm, algorithm):
    """Validate the arguments; return (sendbuf, recvbuf or None, ReduceOp, backend)."""
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"ringtree allreduce: comm must be an intracommunicator, got {comm!r}")
    rank = comm.Get_rank()
    try:
        return _checked_on_rank(sendbuf, recvbuf, op, algorithm)
    except (TypeError, ValueError) as error:
        raise type(error)(f"ringtree allreduce on rank {rank}: {error}") from None


def _checked_on_rank(sendbuf, recvbuf, op, algorithm):
    op = parse_op(op)
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; use 'auto' or one of {sorted(ALGORITHMS)}")
    if sendbuf is MPI.IN_PLACE:
        if recvbuf is None:
            raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold the input, but it is None")
        sendbuf = recvbuf
    backend = _array_backend(sendbuf, "sendbuf")
    check_dtype(sendbuf.dtype, op)
    if recvbuf is not None:
        if _array_backend(recvbuf, "recvbuf") is not backend:
            raise TypeError(f"sendbuf is a {type(sendbuf).__name__} but recvbuf is a {type(recvbuf).__name__}")
        if recvbuf.dtype != sendbuf.dtype:
            raise TypeError(f"sendbuf has dtype {sendbuf.dtype} but recvbuf has dtype {recvbuf.dtype}")
        if recvbuf.shape != sendbuf.shape:
            raise ValueError(f"sendbuf has shape {sendbuf.shape} but recvbuf has shape {recvbuf.shape}")
        if not recvbuf.flags.writeable:
            raise ValueError("recvbuf is read-only")
        if sendbuf.size and not backend.same_memory(sendbuf, recvbuf) and backend.overlaps(sendbuf, recvbuf):
            raise ValueError("sendbuf and recvbuf overlap without being the same memory; use MPI.IN_PLACE")
    return sendbuf, recvbuf, op, backend


def _array_backend(buf, name):
    backend = backend_for(buf)
    if backend is None:
        raise TypeError(f"{name} must be a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous (strides {buf.strides} for shape {buf.shape}); "
                         "pass a contiguous copy, e.g. numpy.ascontiguousarray")
    return backend
