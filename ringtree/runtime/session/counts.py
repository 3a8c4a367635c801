"""The count matrix of an alltoall given counts: each rank knows what it sends each rank and receives
from each, none the whole. The ranks sum their rows and columns into a matrix of every rank's
(small_allreduce: a call like any other, tagged, timed and watched), then each checks, alike on
every rank, that what each rank sends another is what that one expects from it."""

from __future__ import annotations

import numpy as np

from ...errors import MismatchError
from ...ops import ReduceOp
from ..safety.threads import get_ident
from .small import small_allreduce, stepwise_run

__all__ = ["count_matrix"]


def count_matrix(state, sent: tuple[int, ...], received: tuple[int, ...], timeout: float | None) -> tuple[int, ...]:
    """The counts of every rank's alltoall, as ir.Collective takes them: N alike where every block is one
    size, else the N×N matrix row by row. MismatchError on every rank where two ranks' counts differ;
    nothing of the data has been sent then, so the communicator stays usable."""
    size, rank = state.size, state.rank
    arrays = state.exchanging.get(get_ident())
    if arrays is None:  # made once per thread, with their run bound to them (a third of the exchange's time)
        mine = np.zeros(2 * size * size, np.int64)  # rank r's row, then its column, in its slot
        every = np.empty_like(mine)
        arrays = state.exchanging[get_ident()] = (mine, every, stepwise_run(state, mine, every, ReduceOp.SUM))
    mine, every, bound = arrays
    mine[2 * size * rank:2 * size * (rank + 1)] = sent + received
    small_allreduce(state, mine, every, ReduceOp.SUM, timeout, bound)
    table = every.tolist()  # lists, not arrays: at these sizes each numpy call costs more than the loop
    rows = [table[2 * size * s:2 * size * s + size] for s in range(size)]
    expected = [table[2 * size * d + size:2 * size * (d + 1)] for d in range(size)]  # [d][s]: d's from s
    wrong = [(s, d) for s in range(size) for d in range(size) if rows[s][d] != expected[d][s]]
    if wrong:
        described = [f"rank {s} sends rank {d} {rows[s][d]} elements, rank {d} expects {expected[d][s]}"
                     for s, d in wrong[:4]]
        raise MismatchError(f"ringtree alltoall on rank {rank}: the ranks' counts differ: " + "; ".join(described)
                            + (f" (and {len(wrong) - 4} more)" if len(wrong) > 4 else ""))
    counts = tuple(count for row in rows for count in row)
    return counts[:size] if counts.count(counts[0]) == len(counts) else counts
