"""What a persistent allreduce costs a call: ringtree.allreduce_init's Start + Wait against allreduce,
iallreduce(...).wait(), and MPI's own Allreduce and Allreduce_init, in one run.

    mpiexec -n 2 python scripts/persistent-cost.py [--sizes 8,4K,1M] [--algorithms auto,recursive_doubling] [--iters 31]

Online tuning's trials are run first. Timing is bench's (turns in shuffled order, medians of the
slowest rank).
"""

import argparse

import numpy as np
from mpi4py import MPI

import ringtree
from ringtree.commands.arguments import format_size, parse_size
from ringtree.commands.measure import time_in_turns

WARM_UP = 60  # calls per size and algorithm: past online tuning's trials


def persistent_call(request):
    def call():
        request.Start()
        request.Wait()
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,4K,1M")
    parser.add_argument("--algorithms", default="auto,recursive_doubling")
    parser.add_argument("--iters", type=int, default=31)
    args = parser.parse_args()
    try:
        sizes = [parse_size(size) for size in args.sizes.split(",")]
    except ValueError as error:
        parser.error(str(error))
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        print(f"{world.Get_size()} ranks, float64 sum, medians of {args.iters} turns (µs a call)\n\n"
              "| size | algorithm | MPI Allreduce | MPI Allreduce_init | allreduce | iallreduce().wait() | "
              "allreduce_init | init / allreduce | init / MPI Allreduce |\n"
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for nbytes in sizes:
        data = np.ones(max(1, nbytes // 8))
        out = np.empty_like(data)
        native = world.Allreduce_init(data, out)
        for algorithm in args.algorithms.split(","):
            ours = ringtree.allreduce_init(data, out, comm=world, algorithm=algorithm)
            calls = {"native": lambda d=data, o=out: world.Allreduce(d, o), "native init": persistent_call(native),
                     "allreduce": lambda d=data, o=out, a=algorithm: ringtree.allreduce(d, o, comm=world, algorithm=a),
                     "iallreduce": lambda d=data, o=out, a=algorithm: ringtree.iallreduce(d, o, comm=world,
                                                                                          algorithm=a).wait(),
                     "init": persistent_call(ours)}
            for call in calls.values():
                for _ in range(WARM_UP):
                    call()
            median = {name: seconds * 1e6 for name, seconds in time_in_turns(world, calls, 0.01, args.iters, 3.0).items()}
            ours.Free()
            if world.Get_rank() == 0:
                print(f"| {format_size(nbytes)} | {algorithm} | {median['native']:.2f} | {median['native init']:.2f} | "
                      f"{median['allreduce']:.2f} | {median['iallreduce']:.2f} | {median['init']:.2f} | "
                      f"{median['init'] / median['allreduce']:.2f} | {median['init'] / median['native']:.2f} |",
                      flush=True)
        native.Free()


if __name__ == "__main__":
    main()
