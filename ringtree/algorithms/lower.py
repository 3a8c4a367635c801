"""Shape -> Program: the one place where a call's shape decides which passes its schedule takes.

    generator (the registry)  ->  segmented (pipeline.py)  ->  staged (staging.py)  ->  steps (order.py)

The engine, the simulator and the verifier all take their schedules from
`lower`, so what is simulated and verified is what runs.
"""

from __future__ import annotations

from typing import NamedTuple

from ..schedule.ir import ALLREDUCE, Collective, Schedule
from ..schedule.order import steps
from ..schedule.pipeline import segmented
from ..schedule.staging import staged
from ..schedule.topology import Topology
from . import Algorithm, algorithm_of

__all__ = ["Shape", "Program", "lower", "lower_entry"]


class Shape(NamedTuple):
    """What decides one rank's program for a call."""

    algorithm: str
    nranks: int
    rank: int
    count: int  # elements
    segment: int = 0  # elements per segment; 0: not segmented
    window: int = 4  # segments in flight into scratch; staging slots per channel
    staged: bool = False  # messages through host memory (device buffers, an MPI that is not CUDA-aware)
    stepwise: bool = False  # also the steps of the stepwise path (unsegmented schedules only)
    collective: Collective = ALLREDUCE
    topology: Topology | None = None  # which ranks share a node; None: one node
    ipc_peers: frozenset[int] = frozenset()  # staged or not, messages to these go by IPC: never staged


class Program(NamedTuple):
    """One rank's schedule for a call, through every pass its shape needs."""

    schedule: Schedule
    steps: tuple[tuple[int, ...], ...] | None  # for the stepwise path; None where it does not run


def lower(shape: Shape) -> Program:
    return lower_entry(algorithm_of(shape.collective.name, shape.algorithm), shape)


def lower_entry(algorithm: Algorithm, shape: Shape) -> Program:
    """lower() of `algorithm`, registered or not (the registration verifies an entry before it is)."""
    if shape.stepwise and shape.segment:
        raise ValueError("the stepwise path runs unsegmented schedules only; give segment=0")
    node_aware = shape.topology is not None and algorithm.node_aware
    arguments = (shape.collective,) if shape.collective.kind.given_collective else ()
    schedule = algorithm.generator(shape.nranks, shape.rank, shape.count, *arguments,
                                   **({"topology": shape.topology} if node_aware else {}))
    if shape.segment:
        shared_links = node_aware and shape.topology.nodes > 1 and max(shape.topology.ranks_per_node) > 1
        schedule = segmented(schedule, shape.segment, shape.window, ahead=shared_links and algorithm.receives_ahead)
    if shape.staged:
        schedule = staged(schedule, shape.window, shape.ipc_peers)
    return Program(schedule, steps(schedule) if shape.stepwise else None)
