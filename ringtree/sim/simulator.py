"""simulate(): every rank's schedule of one allreduce under the α-β-γ model, without MPI.

The model: a message of b bytes takes α + β·b. It holds the sender's send port
and the receiver's receive port for that long (each rank has one of each: full
duplex) and starts once its send and its receive are both posted and both
ports are free. A reduction or copy of b bytes takes γ·b on its rank's one
processor. An optional `overhead` is the fixed cost of a call (a Python call's
argument checks and plan lookup): every rank starts that late. And as MPI
libraries switch from an eager protocol to a rendezvous (a handshake first)
above some size, messages of more than `eager_limit` bytes may take
`alpha_rendezvous` instead of α. With `duplex=False` a rank has one port for
both directions, as where the processors at both ends copy a message over
shared memory: a rank then sends or receives, not both at once. With a
`setup` of h seconds, a message also holds both its ranks for its first
h seconds, so that a rank starts one message at a time: an exchange between
two ranks takes h + α + β·b where a one-way message takes α + β·b, as
measured over shared memory, between full duplex and one port. An op is
posted or started once its dependencies have finished and, for a message,
once the message before it on its channel was posted: as the engine does
(with `stepwise`, also once the step before it has finished, as on the
stepwise path). Messages and reductions waiting for a port or the processor get
it in the order they became ready, ties in schedule order.

The schedules are the engine's own (algorithms.lower: segmented when `segment`
is given), so the traffic counted is exactly the traffic the engine sends. Messages hold
whole elements of `itemsize` bytes, so where the element count does not
divide evenly, chunks differ by one element and per-rank bytes differ from
the ideal share by that rounding (for ring, at most 2(N-1) elements).

A schedule that its generator declares the same on every rank up to turning
the ranks around (an Algorithm's `turning`: the ring, less the ops on empty chunks)
is built for rank 0 only, and every rank's op k is simulated at once, as numpy
vectors over the ranks, with the same result as the event simulation
(turned.py); where that equivalence cannot be shown for the costs given (two
ops of a rank's processor ready at once, say, or one port per rank), the
event simulation (events.py) runs instead, on every rank's schedule turned
from rank 0's where no chunk is empty. One whose every P-th rank's schedule is
the same up to turning (an Algorithm's `period`: the ring's where chunks of two
lengths split into different numbers of segments) is simulated on P ranks
that stand for all.
"""

from __future__ import annotations

from ..algorithms import algorithm_of
from ..algorithms.lower import Shape
from ..schedule.collectives import kind_of
from ..schedule.ir import Collective, even_chunks
from ..schedule.topology import Topology
from .events import run_events
from .flat import flat_schedule, flat_schedules, without_gc
from .result import Call, Costs, SimResult
from .turned import run_periodic, run_turned, turned_schedules

__all__ = ["simulate", "collective_of"]


def simulate(algorithm: str, nranks: int, nbytes: int, costs: Costs, *, itemsize: int = 4, segment: int = 0,
             window: int = 4, stepwise: bool = False, trace: bool = False, progress: bool = False,
             collective: str = "allreduce", root: int = 0, topology: Topology | None = None) -> SimResult:
    """Simulate one allreduce (or other `collective`, of `root`) of `nbytes` (whole elements of
    `itemsize` bytes, the blocks of a reduce-scatter or allgather together, split as evenly as they
    go) on `nranks` ranks.

    `segment` (bytes, 0 for none) and `window` pipeline the schedules as the
    engine does. `stepwise` runs each rank's ops in their listed order, a step
    at a time, as the stepwise path does for a blocking call of an unsegmented
    schedule up to its registry entry's stepwise_max. With `trace`, the result
    lists every op's start and finish. With `progress`, a simulation of every
    rank shows progress bars on stderr, where that is a terminal. With a
    `topology` of several nodes, the schedules are the node-aware ones the engine
    runs there, and messages between nodes cost `costs.between_nodes`.
    """
    entry = algorithm_of(collective, algorithm)
    if nranks < 1 or nbytes < 0 or itemsize < 1 or nbytes % itemsize:
        raise ValueError(f"need nranks >= 1 and nbytes a multiple of itemsize >= 1, "
                         f"not nranks={nranks} nbytes={nbytes} itemsize={itemsize}")
    costs.check()
    if stepwise and segment:
        raise ValueError("the stepwise path runs unsegmented schedules only; give segment=0")
    call = Call(algorithm, nranks, nbytes, itemsize, segment)
    count, segment_elements = call.count, call.segment_elements
    if topology is not None and topology.nranks != nranks:
        raise ValueError(f"a topology of {topology.nranks} ranks for a simulation of {nranks}")
    if topology is not None and topology.nodes > 1:  # the shortcuts' claims are of rank order, one node
        schedules = flat_schedules(algorithm, nranks, count, segment_elements, window, itemsize, trace,
                                   progress=progress, stepwise=stepwise,
                                   collective=collective_of(collective, nranks, count, root), topology=topology)
        return run_events(schedules, call, costs, trace, progress, topology.node_of)
    if entry.turning is None and entry.period is None:  # no shortcut: every rank's schedule, simulated
        shape = collective_of(collective, nranks, count, root)
        schedules = flat_schedules(algorithm, nranks, count, segment_elements, window, itemsize, trace,
                                   progress=progress, stepwise=stepwise, collective=shape)
        return run_events(schedules, call, costs, trace, progress)
    turns = entry.turning
    built_for = turns(nranks, count) if turns is not None else None
    template = None
    if built_for is not None and nranks > 1 and not trace:
        template = flat_schedule(Shape(algorithm, nranks, 0, built_for, segment_elements, window, False, stepwise),
                                 itemsize, with_regions=True)
    # Both shortcuts need full duplex and no setup: with one port per rank, a port serves two
    # channels, and a setup holds a rank for both, in an order that depends on the times, and
    # ranks alike in schedule need not be alike in time.
    alike = costs.duplex and not costs.setup
    if template is not None and alike:
        with without_gc():
            result = run_turned(template, call, costs, built_for)
        if result is not None:
            return result
    period = entry.period(nranks, count) if entry.period is not None else nranks
    if period < nranks and alike and not trace:
        result = run_periodic(call, period, costs, window, stepwise)
        if result is not None:
            return result
    schedules = turned_schedules(template, nranks, count, segment_elements, itemsize) if template is not None else None
    if schedules is None:
        schedules = flat_schedules(algorithm, nranks, count, segment_elements, window, itemsize, trace,
                                   progress=progress, stepwise=stepwise)
    return run_events(schedules, call, costs, trace, progress)


def collective_of(name: str, nranks: int, count: int, root: int = 0) -> Collective:
    """The Collective of a call of `count` elements in all: a reduce-scatter's or allgather's in
    blocks as even as they go, an alltoall's alike (ValueError for a root out of range, or an
    alltoall's count that does not split)."""
    kind = kind_of(name)
    if kind.matrix and nranks and count % nranks:
        raise ValueError(f"{name}: {count} elements do not split into {nranks} blocks alike")
    blocks = tuple(size for _, size in even_chunks(count, nranks)) if kind.blocks else ()
    shape = Collective(name, blocks, root)
    shape.check(nranks, count)
    return shape
