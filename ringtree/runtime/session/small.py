"""ringtree's own small allreduce, for what the ranks settle among themselves inside a call: check mode's
comparison where it has a timeout or other threads call, the confirmation that ends a call, online
tuning's combination of its trials' times. Recursive doubling of a few values on the communicator's
state, one plan per shape kept with the state, run a step at a time where nothing else is in flight,
else by the engine. Never through the public API: a call within a call would take its checks, online
tuning and thread rules again."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ...algorithms.lower import Shape
from ...ops import ReduceOp
from ...tuning.selector import WINDOW
from ..engine.stepwise import may_step
from ..safety.mismatch import signature
from ..safety.stalls import Call, watched
from ..safety.threads import get_ident
from ..transports.backend import NumpyBackend
from .again import steps_runner
from .plan import schedule_plan
from .state import comm_state

__all__ = ["small_allreduce", "slowest", "confirm_end"]

ALGORITHM = "recursive_doubling"  # log2(ranks) exchanges, each of the few values: the fewest messages in a row


def small_allreduce(state, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp, timeout: float | None = None,
                    bound=None) -> None:
    """Reduce `sendbuf` (or `recvbuf` in place, where they are one array) with `op` into `recvbuf` on
    every rank of `state`'s communicator: a call like any other, counted and tagged with its signature,
    waited for under `timeout` where one is given. `bound`: stepwise_run's of these arrays, made before."""
    state.check_usable()
    if not may_step(state, timeout):
        _plan(state, recvbuf, op).start(state, sendbuf, recvbuf, sendbuf is recvbuf, timeout).wait()
        return
    run, what = bound or stepwise_run(state, sendbuf, recvbuf, op)
    watched(run, what)


def stepwise_run(state, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> tuple:
    """The stepwise path's run of small_allreduce on these arrays, bound to them, and the call as a stall
    warning names it."""
    plan = _plan(state, recvbuf, op)
    steps = plan.stepwise_steps(sendbuf is recvbuf)
    return (steps_runner(plan, state, steps, sendbuf, recvbuf),
            Call(state, recvbuf.size, recvbuf.dtype, op.value, ALGORITHM, plan.peers))


def _plan(state, recvbuf: np.ndarray, op: ReduceOp):
    dtype, count = recvbuf.dtype, recvbuf.size
    key = (ALGORITHM, count, dtype.char, op)
    plan = state.plans.get(key)
    if plan is None:  # unsplit, with the stepwise path's steps
        shape = Shape(ALGORITHM, state.size, state.rank, count, 0, WINDOW, False, True)
        plan = state.plans[key] = schedule_plan(shape, NumpyBackend, op, dtype,
                                                signature(count, dtype, op.value, ALGORITHM, None), None)
    return plan


def slowest(state, timeout: float | None, times: list[float]) -> list[float]:
    """Online tuning's combination of its trials' times (Tuner.choose): each on the slowest rank."""
    mine = np.array(times)
    low = np.empty_like(mine)
    small_allreduce(state, mine, low, ReduceOp.MAX, timeout)
    return low.tolist()


def confirm_end(comm, timeout: float | None = None) -> None:
    """The end of a call that every rank confirms, where another thread's could have been paired with
    it (one_caller.py): a rank that found a second thread in a call ends it with its notice instead."""
    state = comm_state(MPI.COMM_WORLD if comm is None else comm)
    mine = state.confirming.get(get_ident())
    if mine is None:  # a byte of the thread's own, and its run bound to it once
        byte = np.zeros(1, np.uint8)
        mine = state.confirming[get_ident()] = (byte, stepwise_run(state, byte, byte, ReduceOp.MAX))
    small_allreduce(state, mine[0], mine[0], ReduceOp.MAX, timeout, mine[1])
