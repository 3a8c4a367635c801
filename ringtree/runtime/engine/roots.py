"""Rooted calls of MPI's own that show every rank's root: a small broadcast or reduce run as MPI's
allreduce of its data beside a mark of the root each rank names. Ranks that differ on the root then
all see it and raise MismatchError together, with no comparison of the arguments before the call; a
Bcast or Reduce would leave ranks that each take themselves (or another) for the root with a wrong
result, and no message would show it.

A broadcast's marks are a bit for each rank, combined with a bitwise or over the bytes (the others
give zeros for the data). A reduce's are one element of its dtype for each rank, reduced with the
call's op: where every rank names the same root, the op leaves them as they would be for that root
alone (a sum counts the ranks there), which no other choice of roots does.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ...errors import MismatchError
from ...ops import ReduceOp
from ...schedule.collectives import COLLECTIVES
from ..safety.mismatch import differing

__all__ = ["ROOTS_SHOWN_MAX", "shows_roots", "root_marks", "showing_roots", "roots_differ", "byte_view"]

# Up to this size MPI's own broadcast and reduce run as its allreduce: under MPICH an 8 KiB broadcast
# so costs less than a Bcast and a comparison together, a 16 KiB one more (docs/collectives.md).
ROOTS_SHOWN_MAX = 8192

# A reduce's mark at the root each rank names, and at the others: what the op keeps apart.
_MARKS = {ReduceOp.SUM: (1, 0), ReduceOp.MAX: (1, 0), ReduceOp.BOR: (1, 0), ReduceOp.LOR: (1, 0),
          ReduceOp.MIN: (0, 1), ReduceOp.BAND: (0, 1), ReduceOp.LAND: (0, 1)}


def shows_roots(name: str, op: ReduceOp | None, dtype: np.dtype, size: int) -> bool:
    """Whether a call of collective `name` can show its roots: a broadcast always; a reduce whose op
    keeps the marks apart (an average divides what it receives) in a dtype that counts `size` ranks."""
    kind = COLLECTIVES[name]
    if not kind.rooted:
        return False
    if not kind.reduces:  # a broadcast's
        return True
    if op not in _MARKS or dtype.kind not in "iuf" or dtype.char == "g":
        return False  # a long double's bytes have padding that MPI need not write alike on every rank
    return dtype.kind == "f" or np.iinfo(dtype).max >= size


def root_marks(name: str, op: ReduceOp | None, dtype: np.dtype, size: int, root: int) -> tuple[bytes, bytes]:
    """(this rank's marks for `root`, the marks every rank gets where all name it), as bytes."""
    if not COLLECTIVES[name].reduces:  # a broadcast's
        bits = bytearray((size + 7) // 8)
        bits[root // 8] = 1 << root % 8
        return bytes(bits), bytes(bits)
    named, other = _MARKS[op]
    mine, combined = np.full(size, other, dtype), np.full(size, other, dtype)
    mine[root] = named
    combined[root] = size if op is ReduceOp.SUM else named
    return mine.tobytes(), combined.tobytes()


def showing_roots(state, call, own):
    """A call (`call`, a collective_args.Call) as MPI's own allreduce that shows the roots, on arrays
    of its own, on the communicator of its plan's MPI's own (`own`, a native.MPICollective, with its
    op). Returns (start, after): start() starts it; after() checks the roots and takes the data."""
    comm, op = own.comm, own.op
    name, root, size, kind = call.collective.name, call.collective.root, state.size, call.collective.kind
    reduces = kind.reduces  # a reduce's, else a broadcast's (whose data is the root's target)
    data = byte_view(call.source if kind.has_input else call.target)
    nbytes, at_root = data.nbytes, state.rank == root
    given, expected = root_marks(name, call.reduce_op, call.source.dtype, size, root)
    if reduces:
        mine, mpi_op = np.zeros(call.source.size + size, call.source.dtype), op
    else:
        mine, mpi_op = np.zeros(nbytes + len(given), np.uint8), MPI.BOR
    combined = np.empty_like(mine)
    sent, received = byte_view(mine), byte_view(combined)
    sent[nbytes:] = given
    # nothing comes back to a broadcast's root, nor to a reduce's other ranks
    result = None if at_root != reduces else byte_view(call.target)
    seq = [0]

    def start() -> MPI.Request:
        if reduces or at_root:
            sent[:nbytes] = data
        seq[0] = state.calls  # before the call counts itself: its number
        return comm.Iallreduce(mine if reduces else [mine, MPI.BYTE],
                               combined if reduces else [combined, MPI.BYTE], mpi_op)

    def after() -> None:
        if received[nbytes:] != expected:
            roots_differ(state, name, root, seq[0])
        if result is not None:
            result[:] = received[:nbytes]
    return start, after


def roots_differ(state, name: str, root: int, seq: int):
    """Raise MismatchError: the ranks named different roots for call `seq` of collective `name` (every
    rank is here: it saw the same marks)."""
    named = state.comm.allgather(root)
    raise MismatchError(f"ringtree {name} on rank {state.rank}: the ranks of {state.comm.Get_name()} disagree at "
                        f"call #{seq}: " + " | ".join(differing(
                            "collective", {rank: f"{name} root {value}" for rank, value in enumerate(named)})))


def byte_view(array: np.ndarray) -> memoryview:
    return memoryview(array.view(np.uint8))  # a view first: a dtype such as bfloat16 exports no buffer
