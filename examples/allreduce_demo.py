"""Allreduce one array with ringtree's ring, tree and auto choice, check it, and say what happened.

    mpiexec -n 4 python examples/allreduce_demo.py [--count N] [--op sum|prod|min|max|avg]
"""

import argparse
import hashlib
import time

import numpy as np
from mpi4py import MPI

from ringtree.algorithms import ALGORITHMS
from ringtree.allreduce import allreduce
from ringtree.schedule import OpKind
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
        print(f"{'algorithm':>10} {'rank 0 sends':>13} {'MiB':>7} {'median ms':>10} {'native ms':>10}  result")
    everything_right = True
    for choice in ("ring", "tree", "auto"):
        algorithm = select(data.nbytes, size, data.dtype.name, args.op).algorithm if choice == "auto" else choice
        ours = timed(comm, args.repeat, lambda choice=choice: allreduce(data, op=args.op, algorithm=choice))
        native = timed(comm, args.repeat, lambda: native_allreduce(comm, data, args.op))
        result = allreduce(data, op=args.op, algorithm=choice)
        correct = comm.allreduce(bool(np.array_equal(result, expected)), MPI.LAND)
        identical = len(set(comm.allgather(hashlib.sha256(result.tobytes()).digest()))) == 1
        everything_right &= correct and identical
        if rank == 0:
            sends = [op for op in ALGORITHMS[algorithm](size, 0, data.size).ops if op.kind is OpKind.SEND]
            mib = sum(op.src.count for op in sends) * data.itemsize / 2**20
            name = f"auto={algorithm}" if choice == "auto" else algorithm
            verdict = ("equal to MPI_Allreduce" if correct else "DIFFERS from MPI_Allreduce") + \
                (", identical on all ranks" if identical else ", NOT identical on all ranks")
            print(f"{name:>10} {len(sends):>13} {mib:>7.2f} {ours * 1e3:>10.2f} {native * 1e3:>10.2f}  {verdict}")
    if not everything_right:
        raise SystemExit(1)


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
