"""The MPI library's own Allreduce, as one of `auto`'s candidates."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..ops import MPI_OP, ReduceOp

__all__ = ["NativePlan", "reduces", "native_plan", "run_native"]


class NativePlan(NamedTuple):
    op: MPI.Op
    average: bool
    divide: object  # for avg: the backend's division by the number of ranks
    steps = None  # as a CallPlan without a stepwise path: allreduce's repeat path takes neither
    in_place_steps = None


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


def native_plan(op: ReduceOp, divide) -> NativePlan:
    return NativePlan(MPI_OP[op], op is ReduceOp.AVG, divide)


def run_native(plan: NativePlan, comm, source, target, in_place: bool, nranks: int, in_flight) -> None:
    """MPI's Iallreduce, waited for while ringtree's collectives `in_flight` (engine.InFlight)
    progress: a rank blocked in MPI would leave the ranks that wait on those waiting. Nonblocking on
    every rank, with or without collectives in flight, as MPI matches a nonblocking collective only
    with nonblocking ones."""
    request = comm.Iallreduce(MPI.IN_PLACE if in_place else source, target, plan.op)
    if in_flight.requests or in_flight.queued:
        while not request.Test():
            in_flight.poll()
    else:
        request.Wait()
    if plan.average:
        plan.divide(target, nranks)
