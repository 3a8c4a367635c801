"""The plan of a call shape, the one plan type of every collective: built on the first call of the
shape, looked up after. It runs ringtree's own schedule, or MPI's own collective (its `native`)."""

from __future__ import annotations

from typing import NamedTuple

from ...algorithms.lower import Shape
from ...ops import ReduceOp
from ...schedule.ir import Collective
from ...schedule.staging import is_host
from ...tuning.online import NATIVE
from ...tuning.selector import WINDOW
from ..engine.compiled import CompiledSchedule, compiled
from ..engine.in_flight import LOCK
from ..engine.native import MPICollective, native_plan
from ..engine.pipelined import Execution
from ..safety.mismatch import Signature
from ..safety.stalls import Call
from ..transports.choice import routed

__all__ = ["Plan", "build_plan", "schedule_plan"]


class Plan(NamedTuple):
    """What every call of one shape shares. Of MPI's own collective (`native`), the fields of a schedule
    are None or empty."""

    compiled: CompiledSchedule | None
    steps: tuple | None  # the compiled steps, where the stepwise path may run them
    in_place_steps: tuple | None
    backend: object
    reduce: object  # the backend's reduction of the op; None for a collective that reduces nothing
    bound: tuple | None  # the stepwise path's (reduce, copy, divide): backend.bind(reduce), once
    average: bool
    dtype: object
    free_scratch: list  # scratch buffer sets of finished calls, for the next call to reuse
    stepwise_scratch: list  # the stepwise path's scratch: it runs when no other call is in flight
    peers: tuple  # the ranks the schedule exchanges with, for a stall warning
    signature: Signature  # the call's, in its messages' tags (runtime/safety/mismatch.py)
    transport: object  # the IpcTransport of the peers it reaches (runtime/transports/choice.py), or None
    what: object = None  # the call as a stall warning names it (stalls.Call), made once by build_plan
    native: MPICollective | None = None  # MPI's own collective, where it runs the calls

    def stepwise_steps(self, inplace: bool) -> tuple | None:
        """The compiled steps a blocking call in place or not runs a step at a time; None where it runs
        no step so (MPI's own, a split or asynchronous plan)."""
        return None if self.bound is None else self.in_place_steps if inplace else self.steps

    def new_scratch(self) -> list:
        return [(self.backend.host_empty if is_host(name) else self.backend.empty)(size, self.dtype)
                for name, size in self.compiled.schedule.scratch]

    def start(self, state, source, target, inplace: bool, timeout, then=None) -> Execution:
        """Start a call of the plan on these arrays; `then()` runs once it is done."""
        reduce, copy, divide = self.backend.bind(self.reduce, self.transport is not None)  # None reduces nothing
        scratch = self.free_scratch.pop() if self.free_scratch else self.new_scratch()

        def finish() -> None:
            if self.average:
                divide(target, state.size)
            self.free_scratch.append(scratch)
            if then is not None:
                then()

        with LOCK:  # it posts its first messages into IN_FLIGHT, which another thread may be polling
            return Execution(self.compiled, [source, target, *scratch], inplace, reduce, copy, state, self.signature,
                             finish, timeout, self.backend.asynchronous, self.transport)


def schedule_plan(shape: Shape, backend, reduce_op: ReduceOp | None, dtype, signature: Signature, transport) -> Plan:
    """The Plan of `shape`'s program with these arrays' backend and dtype (the stepwise path's scratch
    and bound functions made where the shape has steps)."""
    runnable = compiled(shape)
    reduce = backend.reducer(reduce_op) if reduce_op is not None else None
    stepwise = runnable.steps is not None
    plan = Plan(runnable, runnable.steps, runnable.in_place_steps, backend, reduce,
                backend.bind(reduce) if stepwise else None, reduce_op is ReduceOp.AVG, dtype, [], [],
                tuple(sorted({op.peer for op in runnable.schedule.ops if op.peer is not None})), signature, transport)
    if stepwise:
        plan.stepwise_scratch.extend(plan.new_scratch())
    return plan


def build_plan(state, backend, choice, collective: Collective, count: int, dtype, reduce_op: ReduceOp | None,
               sign: Signature, segment: int | None, stepwise: bool = True) -> Plan:
    """The plan of `choice` (an algorithm and a segment) for a new call shape of any collective: MPI's own,
    or the schedule's. `segment`: the caller's (None leaves IPC peers' messages unsplit); `stepwise`:
    whether a blocking call may run it a step at a time, where it is unsplit host memory."""
    if choice.algorithm == NATIVE:
        state.make_room()
        own = native_plan(reduce_op, backend.divide, state, count, dtype, sign, collective)
        plan = Plan(None, None, None, backend, None, None, own.average, dtype, [], [], (), sign, None, native=own)
    else:
        transport, ipc_peers, choice = routed(state, backend, choice, segment)
        elements = max(1, choice.segment // dtype.itemsize) if choice.segment else 0
        shape = Shape(choice.algorithm, state.size, state.rank, count, elements, WINDOW, backend.staged,
                      stepwise and not elements and not backend.asynchronous and transport is None, collective,
                      state.topology if state.topology.nodes > 1 else None, ipc_peers)
        plan = schedule_plan(shape, backend, reduce_op, dtype, sign, transport)
    return plan._replace(what=Call(state, count, dtype, sign.op, sign.algorithm, plan.peers))
