"""A blocking call repeated on the same small arrays: its run kept bound to them (allreduce's fastest path).

allreduce looks the receive array up in AGAIN (by id) and, if the other
arguments are the same objects as before and the arrays pass the checks that
can change in place, calls the entry's run; `docs/design.md`, "The call path".
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..errors import PeerFailure
from .in_flight import IN_FLIGHT
from .state import LAST
from .stepwise import bound_steps, run_stepwise
from .threads import THREADED, get_ident

__all__ = ["AGAIN", "AGAIN_MAX", "REPEATS", "forget_bound", "keep_again", "steps_runner", "repeat_of",
           "repeat_key"]

IN_PLACE, WORLD, NDARRAY = MPI.IN_PLACE, MPI.COMM_WORLD, np.ndarray


def steps_runner(call, state, steps: tuple, source, target):
    """A function of none that runs a stepwise plan's compiled `steps` on the call's arrays, bound to
    them (stepwise.bound_steps): what it looks up, looked up once, for a call repeated on those arrays."""
    steps = bound_steps(steps, [source, target, *call.stepwise_scratch], state.remote)
    reduce, copy, divide = call.bound
    average, nranks, signature = call.average, state.size, call.signature

    def run() -> None:
        try:
            run_stepwise(steps, reduce, copy, state, signature)
        except PeerFailure as error:
            state.broken = error  # messages of the other ranks' call may be left unmatched
            raise
        if average:
            divide(target, nranks)
    return run


class _Again:
    """A small blocking call that ran a stepwise or native plan with no trial, check or timeout, and
    that run bound to its arrays: a loop repeating the call on the same arrays runs it again after
    only the checks those arrays can fail (writability and dtype may change in place). A class with
    slots: its attributes are read faster than a NamedTuple's."""

    __slots__ = ("sendbuf", "op", "algorithm", "comm", "state", "dtype", "inplace", "native", "run", "call", "thread",
                 "handle")

    def __init__(self, sendbuf, op, algorithm, comm, state, dtype, inplace, native, run, call) -> None:
        self.sendbuf = sendbuf  # the caller's array (or IN_PLACE), held so that its id stays its own
        self.op, self.algorithm, self.comm, self.state, self.dtype = op, algorithm, comm, state, dtype
        self.inplace, self.native, self.run = inplace, native, run  # run: the call, bound to the arrays
        self.call = call  # what a stall warning says of it (stalls.Call)
        self.thread = get_ident()  # only the thread that made it runs it: another must be noted (threads.py)
        self.handle = (WORLD if comm is None else comm).handle  # the thread's mark while in it (threads.FIRST_IN)


# By id(recvbuf). Holding the arrays keeps them alive, so only small ones, and a few.
AGAIN: dict[int, _Again] = {}
AGAIN_MAX = 65536  # bytes: above, a call's checks cost under 5 % of it
AGAIN_ENTRIES = 16

# The other collectives' calls by their arguments' ids and values (collectives.py): what a call
# shares with the calls after it on the same arguments.
REPEATS: dict = {}
REPEATS_MAX = 64


def forget_bound() -> None:
    """Forget every run kept bound to arrays: a plan they may hold was freed, or they may wait inside
    MPI, which a call may no longer do."""
    AGAIN.clear()
    REPEATS.clear()


def keep_again(sendbuf, recvbuf, op, algorithm, comm, state, dtype, inplace: bool, native: bool, run, what) -> _Again:
    """Keep `run`, a blocking allreduce's run bound to these arrays, for its repeats on them."""
    if len(AGAIN) >= AGAIN_ENTRIES:
        AGAIN.clear()
    again = AGAIN[id(recvbuf)] = _Again(sendbuf, op, algorithm, comm, state, dtype, inplace, native, run, what)
    return again


def repeat_of(sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout, blocking=True):
    """The shortcut of a stepwise or native call like an earlier one on the same communicator: same
    op, algorithm, dtype, size and in-place-ness, numpy arrays, default segment, check and timeout.
    Only what may differ between such calls is checked: the arrays' layout, writability and overlap.
    Returns (call plan, state, steps, source, target, in place), or None for allreduce to check the
    call in full. A `blocking` call takes it only with nothing in flight (the stepwise path)."""
    last = LAST[0]  # read once: another thread may change it
    if ((get_ident() != THREADED[0] and not THREADED[1])  # a second thread's first call: allreduce notes it
            or type(recvbuf) is not NDARRAY or segment is not None or check is not None or timeout is not None
            or type(algorithm) is not str or (blocking and (IN_FLIGHT.requests or IN_FLIGHT.queued))
            or (WORLD if comm is None else comm) is not last[0]):
        return None
    state = last[1]
    inplace = sendbuf is IN_PLACE or sendbuf is recvbuf
    # The key as repeat_key gives it, inlined: this path counts every 0.1 µs.
    call = state.repeats.get((op if type(op) is str else id(op), algorithm, recvbuf.dtype, recvbuf.size, inplace))
    flags = recvbuf.flags
    if call is None or not flags.carray or state.broken is not None:  # carray: C-contiguous, writeable
        return None
    target = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
    if inplace:
        return call, state, call.in_place_steps, target, target, True
    if type(sendbuf) is not NDARRAY or sendbuf.dtype is not recvbuf.dtype or not flags.owndata:
        return None
    flags = sendbuf.flags
    if not (flags.c_contiguous and flags.owndata) or sendbuf.shape != recvbuf.shape:
        return None  # views may overlap, which allreduce checks
    return call, state, call.steps, sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1), target, False


def repeat_key(op, algorithm: str, target, inplace: bool) -> tuple:
    """The key of a call's plan in its state's `repeats` (repeat_of inlines it): the op, a name by
    value, one of MPI's predefined ops or ReduceOp's members by identity (they live as long as the
    process); the algorithm; the receive array's dtype and size; and whether the call is in place."""
    return (op if type(op) is str else id(op), algorithm, target.dtype, target.size, inplace)
