"""Allreduce one array with ringtree's ring, tree and auto choice, check it, and say what happened.

    mpiexec -n 4 python examples/allreduce_demo.py [--count N] [--op sum|prod|min|max|avg]

auto is timed once online tuning has tried its candidates on the first calls of this kind of call
and committed to one (docs/algorithms.md), which the table names.
"""

import argparse
import hashlib
import time

import numpy as np
from mpi4py import MPI

from ringtree.algorithms import ALGORITHMS
from ringtree.allreduce import allreduce
from ringtree.ops import parse_op
from ringtree.runtime.engine.native import reduces
from ringtree.runtime.session.state import comm_state
from ringtree.schedule import OpKind
from ringtree.tuning.online import NATIVE, key_of
from ringtree.tuning.selector import select

NATIVE_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000, help="float32 elements per rank")
    parser.add_argument("--op", default="sum", choices=sorted(NATIVE_OPS))
    parser.add_argument("--repeat", type=int, default=10, help="timed repetitions per algorithm")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # Small integers: every summation order gives the same float32 bits as MPI's.
    data = np.random.default_rng(rank).integers(-100, 100, args.count).astype(np.float32)
    expected = native_allreduce(comm, data, args.op)

    if rank == 0:
        print(f"allreduce of {args.count:,} float32 ({data.nbytes / 2**20:.1f} MiB) per rank, op={args.op}, "
              f"{size} ranks, {MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"{'algorithm':>18} {'rank 0 sends':>13} {'MiB':>7} {'median ms':>10} {'native ms':>10}  result")
    everything_right = True
    for choice in ("ring", "tree", "auto"):
        algorithm = settled_auto(comm, data, args.op) if choice == "auto" else choice
        ours = timed(comm, args.repeat, lambda choice=choice: allreduce(data, op=args.op, algorithm=choice))
        native = timed(comm, args.repeat, lambda: native_allreduce(comm, data, args.op))
        result = allreduce(data, op=args.op, algorithm=choice)
        correct = comm.allreduce(bool(np.array_equal(result, expected)), MPI.LAND)
        identical = len(set(comm.allgather(hashlib.sha256(result.tobytes()).digest()))) == 1
        everything_right &= correct and identical
        if rank == 0:
            if algorithm == NATIVE:  # MPI's own: its messages are MPI's business
                sent = f"{'-':>13} {'-':>7}"
            else:
                sends = [op for op in ALGORITHMS[algorithm](size, 0, data.size).ops if op.kind is OpKind.SEND]
                sent = f"{len(sends):>13} {sum(op.src.count for op in sends) * data.itemsize / 2**20:>7.2f}"
            name = f"auto={algorithm}" if choice == "auto" else algorithm
            verdict = ("equal to MPI_Allreduce" if correct else "DIFFERS from MPI_Allreduce") + \
                (", identical on all ranks" if identical else ", NOT identical on all ranks")
            print(f"{name:>18} {sent} {ours * 1e3:>10.2f} {native * 1e3:>10.2f}  {verdict}")
    if not everything_right:
        raise SystemExit(1)


def settled_auto(comm, data, op) -> str:
    """Make the calls with which online tuning tries auto's candidates for this kind of call (size
    class, out of place, element size, whether MPI's own can run it), until it commits to one; the
    algorithm auto then runs ("native": MPI's own)."""
    tuner = comm_state(comm).tuner  # None with RINGTREE_TUNE=off
    key = key_of(data.nbytes, False, data.itemsize, reduces(data.dtype, parse_op(op)))
    while tuner is not None and key not in tuner.committed:
        allreduce(data, op=op)
    if tuner is not None:
        return tuner.committed[key].algorithm
    return select(data.nbytes, comm.Get_size(), data.dtype.name, op, native=reduces(data.dtype, parse_op(op))).algorithm


def native_allreduce(comm, data, op):
    result = np.empty_like(data)
    comm.Allreduce(data, result, NATIVE_OPS[op])
    if op == "avg":
        result /= comm.Get_size()
    return result


def timed(comm, repeat, run):
    """Median over `repeat` runs of the slowest rank's time, in seconds."""
    times = []
    for _ in range(repeat):
        comm.Barrier()
        start = time.perf_counter()
        run()
        times.append(comm.allreduce(time.perf_counter() - start, MPI.MAX))
    return float(np.median(times))


if __name__ == "__main__":
    main()
