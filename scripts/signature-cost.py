"""What the default mismatch detection costs: allreduce with RINGTREE_SIGNATURES on and off, and native MPI, in one run.

    mpiexec -n 2 python scripts/signature-cost.py [--sizes 8,1M] [--algorithms auto,ring] [--iters 31]

Each setting gets a communicator of its own (the setting is read when ringtree
sets a communicator up). Online tuning's trials are run first. Timing is
bench's (turns in shuffled order, medians of the slowest rank).
"""

import argparse
import os

import numpy as np
from mpi4py import MPI

from ringtree import settings
from ringtree.allreduce import allreduce
from ringtree.commands.arguments import format_size, parse_size
from ringtree.commands.measure import time_in_turns

WARM_UP = 60  # calls per size and algorithm: past online tuning's trials


def communicator_with(signatures: str) -> MPI.Comm:
    os.environ["RINGTREE_SIGNATURES"] = signatures
    settings.reload()
    comm = MPI.COMM_WORLD.Dup()
    allreduce(np.ones(1), comm=comm)  # sets ringtree up on it, with this setting
    return comm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,1M")
    parser.add_argument("--algorithms", default="auto,recursive_doubling,tree,ring")
    parser.add_argument("--iters", type=int, default=31)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    on, off = communicator_with("1"), communicator_with("0")
    if world.Get_rank() == 0:
        print(f"{world.Get_size()} ranks, float64 sum, medians of {args.iters} turns\n\n"
              "| size | algorithm | native µs | signatures off µs | on µs | on / off |\n|---:|---|---:|---:|---:|---:|")
    for nbytes in map(parse_size, args.sizes.split(",")):
        data = np.ones(max(1, nbytes // 8))
        out = np.empty_like(data)
        for algorithm in args.algorithms.split(","):
            calls = {"native": lambda data=data, out=out: world.Allreduce(data, out),
                     "off": lambda data=data, out=out, a=algorithm: allreduce(data, out, comm=off, algorithm=a),
                     "on": lambda data=data, out=out, a=algorithm: allreduce(data, out, comm=on, algorithm=a)}
            for call in calls.values():
                for _ in range(WARM_UP):
                    call()
            median = time_in_turns(world, calls, 0.01, args.iters, 3.0)
            if world.Get_rank() == 0:
                print(f"| {format_size(nbytes)} | {algorithm} | {median['native'] * 1e6:.2f} | {median['off'] * 1e6:.2f} | "
                      f"{median['on'] * 1e6:.2f} | {median['on'] / median['off']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
