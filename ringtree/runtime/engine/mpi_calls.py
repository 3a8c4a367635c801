"""How each collective is MPI's own call: its nonblocking start on a call's arrays (native_start), and
the persistent request of a plan of MPI's own on buffers of the plan's (persistent_request). Neither
waits: native.py's calls start and wait for them."""

from __future__ import annotations

from functools import partial

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from ...schedule.ir import Collective

__all__ = ["native_start", "persistent_request"]


def persistent_request(collective: Collective, comm, count: int, dtype: np.dtype, op, rank: int, size: int):
    """(buffer, received, request) of a plan's persistent request of `collective` (native.MPICollective's).
    What reduces nothing goes as bytes, which every MPI has."""
    kind, root, counts = collective.kind, collective.root, collective.counts
    if kind.rooted and root is None:  # as roots.showing_roots: the data, then a mark for each rank's root
        if kind.reduces:
            buffer = np.zeros(count + size, dtype)
            return buffer, buffer, comm.Allreduce_init(MPI.IN_PLACE, buffer, op)
        buffer = np.zeros(count * dtype.itemsize + (size + 7) // 8, np.uint8)  # a broadcast's: a bit each
        return buffer, buffer, comm.Allreduce_init(MPI.IN_PLACE, [buffer, MPI.BYTE], MPI.BOR)
    init = getattr(comm, kind.persistent)  # Allreduce_init, Bcast_init, ...
    if not kind.reduces:
        buffer = np.empty(count * dtype.itemsize, np.uint8)
        if not kind.has_input:  # a broadcast: the root's buffer becomes every rank's
            return buffer, buffer, init([buffer, MPI.BYTE], root)
        if kind.matrix:  # an alltoall: what a rank sends and what it receives apart
            received = np.empty(count * dtype.itemsize, np.uint8)
            return buffer, received, init([buffer, MPI.BYTE], [received, MPI.BYTE])
        sizes = [c * dtype.itemsize for c in counts]  # an allgather: in place, in its blocks
        return buffer, buffer, comm.Allgatherv_init(MPI.IN_PLACE, [buffer, sizes, None, MPI.BYTE])
    buffer = np.empty(count, dtype)
    if kind.blocks:  # a reduce-scatter: this rank's block of the total
        received = np.empty(counts[rank], dtype)
        return buffer, received, init(buffer, received, list(counts), op)
    if not kind.rooted:
        return buffer, buffer, init(MPI.IN_PLACE, buffer, op)
    if rank == root:
        return buffer, buffer, init(MPI.IN_PLACE, buffer, op, root)
    return buffer, None, init(buffer, None, op, root)


def native_start(call, own, source=None, target=None):
    """MPI's own nonblocking collective of a call (a collective_args.Call; on `source` and `target` in
    place of its arrays, if given) on the communicator of its plan's MPI's own (`own`, a
    native.MPICollective), as a function of none made once for the call's repeats (a partial of
    mpi4py's method: no Python frame of its own)."""
    collective, comm, op = call.collective, own.comm, own.op
    source, target = call.source if source is None else source, call.target if target is None else target
    kind, root, counts = collective.kind, collective.root, list(collective.counts)
    start = getattr(MPI.Intracomm, kind.nonblocking)  # Ireduce_scatter, Ibcast, ...: looked up once, here
    if kind.reduces and kind.blocks:  # Ireduce_scatter: under MPICH faster than Ireduce_scatter_block
        return partial(start, comm, source, target, counts, op)
    if kind.reduces and not kind.rooted:  # an allreduce
        return partial(start, comm, MPI.IN_PLACE if call.inplace else source, target, op)
    if kind.reduces:  # a reduce
        return partial(start, comm, MPI.IN_PLACE if call.inplace else source,
                       target if target.size or not source.size else None, op, root)
    # These reduce nothing: any dtype goes, as bytes where MPI has no datatype of it.
    whole, mine = _typed(target), _typed(source)
    if kind.rooted:  # a broadcast
        return partial(start, comm, whole, root)
    if kind.matrix:  # of blocks alike: auto gives a count matrix to pairwise (tuning/collectives.py)
        return partial(start, comm, mine, whole)
    sendbuf = MPI.IN_PLACE if call.inplace else mine  # an allgather
    if len(set(counts)) == 1:
        return partial(start, comm, sendbuf, whole)
    if isinstance(whole, list):
        recvbuf = [whole[0], [c * target.dtype.itemsize for c in counts], None, MPI.BYTE]
    else:
        recvbuf = [whole, counts, None, dtlib.from_numpy_dtype(target.dtype)]
    return partial(MPI.Intracomm.Iallgatherv, comm, sendbuf, recvbuf)


def _typed(array):
    """`array` as MPI takes it: itself where every MPI has its dtype, else its bytes."""
    return array if array.dtype.isnative and array.dtype.char in "?bBhHiIlLqQfdFD" else [array.view(np.uint8), MPI.BYTE]
