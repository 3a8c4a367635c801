"""The allreduce of the ranks of one node against the machine's one-copy memory bound, in one run.

Run under mpiexec, all ranks on one node. For every size, in turns whose order is shuffled per
repetition, every rank times: MPI's own Allreduce; ringtree's `auto`; ringtree's ring allreduce; and the one-copy
bound: what a ring allreduce cannot go below where each reduce-scatter step is one add of its chunk
(numpy's, out of place) and each allgather step one copy, measured with every rank doing the same at
once. A turn is a barrier and then calls for about --batch seconds; its time per call is the slowest
rank's; the table shows medians over --repeats repetitions, and the ratios as the issue asks them:
bound / time (the share of the bound reached) and MPI / time (the speed-up over MPI's own).

    mpiexec -n 2 python scripts/memory-bound.py -b 8 -e 32M
"""

import argparse
import random
import time

import numpy as np
from mpi4py import MPI

from ringtree.commands.arguments import format_size, parse_size


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", "--minbytes", type=parse_size, default=8)
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    parser.add_argument("-f", "--stepfactor", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batch", type=float, default=2e-3, help="seconds of calls per turn (default 2 ms)")
    return parser.parse_args()


def main():
    args = arguments()
    import ringtree

    comm = MPI.COMM_WORLD
    n = comm.size
    sizes = []
    size = max(4 * n, args.minbytes)
    while size <= args.maxbytes:
        sizes.append(size // (4 * n) * 4 * n)
        size *= args.stepfactor
    if comm.rank == 0:
        print(f"{n} ranks, float32 sum, median of {args.repeats} repetitions (µs per call)\n")
        print("| size | MPI | auto | ring | bound | auto/bound | ring/bound | MPI/auto | MPI/ring |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nbytes in sizes:
        cases = cases_of(ringtree, comm, nbytes // 4)
        for case in cases.values():  # warm up, online tuning's trials included
            for _ in range(100):
                case()
        times = {name: [] for name in cases}
        order = list(cases)
        for _ in range(args.repeats):
            random.Random(len(times["MPI"])).shuffle(order)
            for name in order:
                calls = max(1, int(args.batch / max(timed(comm, cases[name], 1), 1e-7)))
                times[name].append(timed(comm, cases[name], calls))
        if comm.rank == 0:
            us = {name: 1e6 * float(np.median(t)) for name, t in times.items()}
            print(f"| {format_size(nbytes)} | {us['MPI']:.1f} | {us['auto']:.1f} | {us['ring']:.1f} | {us['bound']:.1f} | "
                  f"{us['bound'] / us['auto']:.0%} | {us['bound'] / us['ring']:.0%} | {us['MPI'] / us['auto']:.2f} | "
                  f"{us['MPI'] / us['ring']:.2f} |", flush=True)


def cases_of(ringtree, comm, count: int) -> dict:
    """What each case calls once, on float32 arrays of `count` elements."""
    x = np.random.default_rng(comm.rank).random(count, np.float32)
    out = np.empty_like(x)
    a, b, c = (np.ones(count // comm.size, np.float32) for _ in range(3))
    steps = range(comm.size - 1)
    return {
        "MPI": lambda: comm.Allreduce(x, out),
        "auto": lambda: ringtree.allreduce(x, out, comm=comm),
        "ring": lambda: ringtree.allreduce(x, out, comm=comm, algorithm="ring"),
        "bound": lambda: ([np.add(a, b, out=c) for _ in steps], [np.copyto(a, c) for _ in steps]),
    }


def timed(comm, case, calls: int) -> float:
    """Seconds per call of `calls` back-to-back calls after a barrier, on the slowest rank."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        case()
    return comm.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX)


if __name__ == "__main__":
    main()
