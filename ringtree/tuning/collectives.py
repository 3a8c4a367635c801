"""Choose an algorithm and a segment size for a reduce-scatter, allgather, broadcast or reduce: MPI's
own is a candidate, as for allreduce. A pure function of values equal on every rank (the collective,
its size in bytes, every block together, the rank count, and the tuning table, whose hash the ranks
compare once per communicator), so every rank picks the same.

The rules are the tuning table's "collectives" (selector.py has its format), which `python -m ringtree
tune --collective NAME` measures and writes; a table without rules for a collective (one tuned for
allreduce alone) leaves it to the packaged table's. docs/collectives.md has the tables the packaged
rules rest on.
"""

from __future__ import annotations

from ..algorithms import REGISTRY
from .online import NATIVE
from .selector import Choice, packaged_table, table

__all__ = ["NATIVE", "choose", "rules_for"]


def choose(collective: str, nbytes: int, nranks: int, algorithm: str = "auto", segment: int | None = None,
           native: bool = True, matrix: bool = False) -> Choice:
    """The algorithm and segment size for `collective` of `nbytes` on `nranks` ranks; `native`: whether
    MPI's own can run it; `matrix`: an alltoall of a count matrix, which auto gives to pairwise (Bruck
    does not take one; MPI's own Ialltoallv, polled, was the slower, docs/collectives.md)."""
    source = "call"
    if matrix and algorithm == "auto":
        algorithm, source = "pairwise", "a count matrix"
    if algorithm == "auto":
        origin, rules = rules_for(collective, nranks, native)
        # The first rule whose sizes reach this one; past the largest size measured, the last rule.
        i, rule = next(((i, rule) for i, rule in enumerate(rules) if rule["bytes"][1] is None
                        or nbytes <= rule["bytes"][1]), (len(rules) - 1, rules[-1]))
        algorithm = rule["algorithm"]
        source = f"table {origin} {collective} {'rules' if native else 'without_native'} {i}"
        if segment is None:
            segment = rule["segment"] or nbytes
    if algorithm == NATIVE:
        return Choice(NATIVE, 0, True, source)
    if segment is None:
        segment = REGISTRY[collective][algorithm].segment  # where the call names one without a segment
    return Choice(algorithm, segment if nbytes > segment else 0, True, source)


def rules_for(collective: str, nranks: int, native: bool = True) -> tuple[str, list[dict]]:
    """(the table's name, its rules by size for `collective` at the measured rank count nearest
    `nranks`, the smaller of two as near): those with MPI's own a candidate, or with `native` False,
    those without."""
    chosen = table() if collective in table().collectives else packaged_table()
    measured = chosen.collectives[collective]
    nearest = min(measured, key=lambda ranks: (abs(ranks - nranks), ranks))
    return chosen.origin, measured[nearest]["rules" if native else "without_native"]
