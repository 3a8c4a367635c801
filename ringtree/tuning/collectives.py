"""Choose an algorithm and a segment size for a reduce-scatter, allgather, broadcast or reduce: MPI's
own is a candidate, as for allreduce. A pure function of values equal on every rank (the collective,
its size in bytes, every block together, and the rank count), so every rank picks the same.

RULES holds, per collective, the choice by size, measured with `python -m ringtree bench
--collective NAME` (docs/collectives.md has the tables they rest on).
"""

from __future__ import annotations

from typing import NamedTuple

from .online import NATIVE

__all__ = ["NATIVE", "CollectiveChoice", "choose", "rules_for", "RULES", "WITHOUT_NATIVE", "SEGMENT_BYTES"]

# Bytes per segment where a rule or the call gives none: pipelining pays once a message is several
# segments long; a chain's depth is the rank count, so it takes shorter segments.
SEGMENT_BYTES = {"chain": 256 << 10}
SEGMENT_BYTES_OTHERWISE = 1 << 20


class CollectiveChoice(NamedTuple):
    algorithm: str  # a generator's name, or NATIVE
    segment: int  # bytes per segment; 0: messages are not split
    source: str  # why: "call" or "rules"


# collective -> {rank count: rules tried in order: (largest message in bytes or None, algorithm)};
# a rank count not listed takes the nearest one's. Measured on a 2-core VM
# (docs/collectives.md): over shared memory MPI's own moves data as fast as pipelined messages can,
# and ringtree wins where there is arithmetic to overlap with the messages.
RULES: dict[str, dict[int, list[tuple[int | None, str]]]] = {
    "reduce_scatter": {
        2: [(512 << 10, NATIVE), (None, "ring")],
        4: [(2 << 20, NATIVE), (None, "pairwise")],
        8: [(2 << 20, NATIVE), (None, "ring")],
    },
    "allgather": {2: [(None, NATIVE)]},
    "broadcast": {
        2: [(None, NATIVE)],
        4: [(8 << 20, NATIVE), (None, "binomial")],
    },
    "reduce": {
        2: [(512 << 10, NATIVE), (None, "rabenseifner")],
        4: [(1 << 20, NATIVE), (None, "rabenseifner")],
    },
}
# Where MPI's own cannot run the call (device memory, a dtype or op MPI lacks): per collective, by size.
WITHOUT_NATIVE = {
    "reduce_scatter": [(64 << 10, "pairwise"), (None, "ring")],
    "allgather": [(64 << 10, "bruck"), (None, "ring")],
    "broadcast": [(256 << 10, "binomial"), (None, "scatter_allgather")],
    "reduce": [(64 << 10, "binomial"), (None, "rabenseifner")],
}


def choose(collective: str, nbytes: int, nranks: int, algorithm: str = "auto", segment: int | None = None,
           native: bool = True) -> CollectiveChoice:
    """The algorithm and segment size for `collective` of `nbytes` on `nranks` ranks; `native`: whether
    MPI's own can run it."""
    source = "call"
    if algorithm == "auto":
        source = "rules"
        rules = rules_for(collective, nranks) if native else WITHOUT_NATIVE[collective]
        algorithm = next(name for largest, name in rules if largest is None or nbytes <= largest)
    if algorithm == NATIVE:
        return CollectiveChoice(NATIVE, 0, source)
    if segment is None:
        segment = SEGMENT_BYTES.get(algorithm, SEGMENT_BYTES_OTHERWISE)
    return CollectiveChoice(algorithm, segment if nbytes > segment else 0, source)


def rules_for(collective: str, nranks: int) -> list[tuple[int | None, str]]:
    """RULES for `collective` at the measured rank count nearest `nranks` (the smaller of two as near)."""
    measured = RULES[collective]
    return measured[min(measured, key=lambda ranks: (abs(ranks - nranks), ranks))]
