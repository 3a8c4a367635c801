"""What check mode costs: allreduce with and without check=True, and native MPI, in one run.

    mpiexec -n 2 python scripts/check-cost.py [--sizes 8,64M] [--iters 31]

Timing is bench's (turns in shuffled order, medians of the slowest rank).
"""

import argparse

import numpy as np
from mpi4py import MPI

from ringtree.allreduce import allreduce
from ringtree.commands.arguments import format_size, parse_size
from ringtree.commands.measure import time_in_turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,64M")
    parser.add_argument("--iters", type=int, default=31)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} ranks, float32 sum\n\n| size | native µs | ringtree µs | with check µs | check costs |")
        print("|---:|---:|---:|---:|---:|")
    for nbytes in map(parse_size, args.sizes.split(",")):
        data = np.ones(nbytes // 4, np.float32)
        out = np.empty_like(data)
        median = time_in_turns(comm, {"native": lambda data=data, out=out: comm.Allreduce(data, out),
                                      "plain": lambda data=data, out=out: allreduce(data, out),
                                      "check": lambda data=data, out=out: allreduce(data, out, check=True)},
                               0.01, args.iters, 3.0)
        if comm.Get_rank() == 0:
            extra = median["check"] - median["plain"]
            print(f"| {format_size(nbytes)} | {median['native'] * 1e6:.1f} | {median['plain'] * 1e6:.1f} | "
                  f"{median['check'] * 1e6:.1f} | {extra * 1e6:+.1f} µs ({extra / median['plain']:+.0%}) |", flush=True)


if __name__ == "__main__":
    main()
