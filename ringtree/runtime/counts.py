"""The count matrix of an alltoall given counts: each rank knows what it sends each rank and receives
from each, none the whole. The ranks sum their rows and columns into a matrix of every rank's
(small_allreduce: a call like any other, tagged, timed and watched), then each checks, alike on
every rank, that what each rank sends another is what that one expects from it."""

from __future__ import annotations

import numpy as np

from ..errors import MismatchError
from ..ops import ReduceOp
from .small import small_allreduce

__all__ = ["count_matrix"]


def count_matrix(state, sent: tuple[int, ...], received: tuple[int, ...], timeout: float | None) -> tuple[int, ...]:
    """The counts of every rank's alltoall, as ir.Collective takes them: N alike where every block is one
    size, else the N×N matrix row by row. MismatchError on every rank where two ranks' counts differ;
    nothing of the data has been sent then, so the communicator stays usable."""
    size, rank = state.size, state.rank
    mine = np.zeros(size * 2 * size, np.int64)  # flat, as small_allreduce takes it
    mine.reshape(size, 2, size)[rank] = sent, received
    every = np.empty_like(mine)
    small_allreduce(state, mine, every, ReduceOp.SUM, timeout)
    every = every.reshape(size, 2, size)
    rows, columns = every[:, 0, :], every[:, 1, :].T  # columns[s, d]: what rank d expects from rank s
    wrong = np.argwhere(rows != columns)
    if wrong.size:
        described = [f"rank {s} sends rank {d} {rows[s, d]} elements, rank {d} expects {columns[s, d]}"
                     for s, d in wrong[:4].tolist()]
        raise MismatchError(f"ringtree alltoall on rank {rank}: the ranks' counts differ: " + "; ".join(described)
                            + (f" (and {len(wrong) - 4} more)" if len(wrong) > 4 else ""))
    counts = tuple(int(c) for c in rows.ravel())
    return counts[:size] if counts.count(counts[0]) == len(counts) else counts
