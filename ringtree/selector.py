"""Choose an algorithm and a segment size for a call.

A pure function of values equal on every rank, so every rank picks the same.
The thresholds were measured on a 2-core VM with 2 ranks (docs/performance.md).
"""

from __future__ import annotations

from typing import NamedTuple

# Up to this size latency dominates: recursive doubling's log2(N) exchanges beat
# the ring's 2(N-1) steps; above it the ring's smaller, spread-out traffic wins.
# A blocking call this small also runs its schedule step by step, with blocking
# MPI calls, which costs less Python per call than the progress engine.
SMALL_MAX_BYTES = 64 * 1024
# Pipelining pays once a message is several segments long; smaller segments
# cost more per-message overhead in Python than they gain in overlap.
SEGMENT_BYTES = 4 << 20
# Segments in flight into scratch per collective: scratch is SEGMENT_BYTES × WINDOW.
WINDOW = 4


class Choice(NamedTuple):
    algorithm: str
    segment: int  # bytes per segment; 0: messages are not split
    blocking: bool  # a blocking call may run the schedule step by step (the lean path)


def select(nbytes: int, nranks: int, algorithm: str = "auto", segment: int | None = None) -> Choice:
    """The algorithm (`algorithm` unless it is "auto") and segment size for a message of `nbytes`."""
    if algorithm == "auto":
        algorithm = "recursive_doubling" if nbytes <= SMALL_MAX_BYTES else "ring"
    if segment is None:
        segment = SEGMENT_BYTES
    return Choice(algorithm, segment if nbytes > segment else 0, nbytes <= SMALL_MAX_BYTES)
