"""Shape -> Program: the one place where a call's shape decides which passes its schedule takes.

    generator (algorithms/)  ->  segmented (pipeline.py)  ->  staged (staging.py)  ->  steps (order.py)

The engine, the simulator and the verifier all take their schedules from
`lower`, so what is simulated and verified is what runs.
"""

from __future__ import annotations

from typing import NamedTuple

from ..algorithms import ALGORITHMS
from .ir import Schedule
from .order import steps
from .pipeline import segmented
from .staging import staged

__all__ = ["Shape", "Program", "lower"]


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


class Program(NamedTuple):
    """One rank's schedule for a call, through every pass its shape needs."""

    schedule: Schedule
    steps: tuple[tuple[int, ...], ...] | None  # for the stepwise path; None where it does not run


def lower(shape: Shape) -> Program:
    if shape.algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {shape.algorithm!r}; known: {', '.join(sorted(ALGORITHMS))}")
    if shape.stepwise and shape.segment:
        raise ValueError("the stepwise path runs unsegmented schedules only; give segment=0")
    schedule = ALGORITHMS[shape.algorithm](shape.nranks, shape.rank, shape.count)
    if shape.segment:
        schedule = segmented(schedule, shape.segment, shape.window)
    if shape.staged:
        schedule = staged(schedule, shape.window)
    return Program(schedule, steps(schedule) if shape.stepwise else None)
