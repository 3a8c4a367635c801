"""The MPI library's own Allreduce, as one of `auto`'s candidates."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..ops import MPI_OP, ReduceOp
from .threads import THREADED

__all__ = ["NativePlan", "reduces", "native_plan", "run_native", "native_runner", "free_plan"]

# Up to this size a call goes through a persistent request (Allreduce_init) on a buffer of the plan's
# own, with a copy in and a copy out, where the MPI has them: on 2 ranks under MPICH faster than
# Iallreduce up to 16 KiB, in place or not (docs/algorithms.md); from 64 KiB the copies cost more.
PERSISTENT_MAX = 16384


class NativePlan(NamedTuple):
    op: MPI.Op
    average: bool
    divide: object  # for avg: the backend's division by the number of ranks
    buffer: np.ndarray | None  # the persistent request's, in place; None: Iallreduce on the caller's arrays
    request: MPI.Prequest | None
    steps = None  # as a CallPlan without a stepwise path: allreduce's repeat path takes neither
    in_place_steps = None
    peers = ()  # whom it waits for is MPI's business


def reduces(dtype: np.dtype, op: ReduceOp) -> bool:
    """Whether MPI reduces `dtype` with `op` everywhere: its predefined types, float16 aside (an
    extension some MPI libraries lack)."""
    if dtype.char == "e" or dtype.kind not in "biufc":
        return False
    try:
        MPI.Datatype.fromcode(dtype.char)
    except (KeyError, ValueError):
        return False
    return op in MPI_OP


def native_plan(op: ReduceOp, divide, comm: MPI.Comm, count: int, dtype: np.dtype) -> NativePlan:
    """The plan of native calls of `count` elements on `comm`. Collective: every rank builds it at
    the same call (a persistent request takes its place among the communicator's collectives)."""
    buffer = request = None
    if count * dtype.itemsize <= PERSISTENT_MAX:
        buffer = np.empty(count, dtype)
        try:
            request = comm.Allreduce_init(MPI.IN_PLACE, buffer, MPI_OP[op])
        except NotImplementedError:  # an MPI before persistent collectives: the same on every rank
            buffer = None
    return NativePlan(MPI_OP[op], op is ReduceOp.AVG, divide, buffer, request)


def free_plan(plan: NativePlan) -> None:
    """Free the plan's persistent request, before its communicator is freed."""
    if plan.request:  # not None, and not freed already (a freed request is MPI.REQUEST_NULL)
        plan.request.Free()


def run_native(plan: NativePlan, comm, source, target, in_place: bool, nranks: int, in_flight) -> None:
    """MPI's allreduce, nonblocking, waited for while ringtree's collectives `in_flight`
    (engine.InFlight) progress: a rank blocked in MPI would leave the ranks that wait on those
    waiting. Nonblocking (persistent or Iallreduce, by size alone) on every rank, with or without
    collectives in flight, as MPI matches a nonblocking collective only with nonblocking ones."""
    buffer = plan.buffer
    if buffer is None:
        request = comm.Iallreduce(MPI.IN_PLACE if in_place else source, target, plan.op)
    else:
        buffer[...] = source
        request = plan.request
        request.Start()
    if in_flight.requests or in_flight.queued or THREADED[1]:
        in_flight.progress_until(request.Test)
    else:
        request.Wait()
    if buffer is not None:
        target[...] = buffer
    if plan.average:
        plan.divide(target, nranks)


def native_runner(plan: NativePlan, comm, source, target, in_place: bool, nranks: int, in_flight):
    """`run_native` of these arguments as a function of none, for a call repeated on the same arrays:
    through a persistent request, its copies go between memoryviews made once (half a numpy
    assignment's time at 8 B)."""
    if plan.buffer is None or plan.average:
        return partial(run_native, plan, comm, source, target, in_place, nranks, in_flight)
    request, buffer, source, target = plan.request, _bytes(plan.buffer), _bytes(source), _bytes(target)

    def run() -> None:
        buffer[:] = source
        request.Start()
        if in_flight.requests or in_flight.queued:
            in_flight.progress_until(request.Test)
        else:
            request.Wait()
        target[:] = buffer
    return run


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B")
