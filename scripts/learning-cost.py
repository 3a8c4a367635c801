"""What online tuning's learning costs: the first N auto calls of each size, against N calls of the
choice it committed to, run from the start.

    RINGTREE_CACHE_DIR=$(mktemp -d) mpiexec -n 2 python scripts/learning-cost.py [--calls 50] [--inplace]

Run it with an empty cache (else there is nothing to learn). For each size, on
a communicator of its own: a barrier, N calls with algorithm "auto" (the
trials, the commitment, then the committed choice), timed as a whole; then N
calls of the committed choice named in the call (native: the MPI library's
own Allreduce), three times, the median. The slowest rank's times.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

from ringtree.allreduce import allreduce
from ringtree.commands.arguments import format_size, parse_size, size_grid
from ringtree.runtime.session.state import comm_state
from ringtree.tuning.online import NATIVE, key_of


def timed(comm, call, calls: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return comm.allreduce(time.perf_counter() - start, MPI.MAX)


def measure(world, nbytes: int, args):
    """(the committed choice, seconds of the learning calls, seconds of as many calls of the choice)."""
    comm = world.Dup()
    data = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(data)
    send = MPI.IN_PLACE if args.inplace else data
    learning = timed(comm, lambda: allreduce(send, out, comm=comm), args.calls)
    option = comm_state(comm).tuner.committed[key_of(nbytes, args.inplace, 4, True)]
    if option.algorithm == NATIVE:
        def final():
            comm.Allreduce(send, out)
    else:
        def final():
            allreduce(send, out, comm=comm, algorithm=option.algorithm, segment=option.segment or 1 << 62)
    final()
    baseline = float(np.median([timed(comm, final, args.calls) for _ in range(3)]))
    comm.Free()
    return option, learning, baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50, help="calls per size")
    parser.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("16"))
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    parser.add_argument("-f", "--stepfactor", type=int, default=4)
    parser.add_argument("--inplace", action="store_true")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        print(f"{world.Get_size()} ranks, float32, {'in place' if args.inplace else 'out of place'}, "
              f"{args.calls} calls per size\n")
        print("| size | committed to | learning ms | committed from the start ms | extra ms | extra |")
        print("|---:|---|---:|---:|---:|---:|")
    total_learning = total_final = 0.0
    for nbytes in size_grid(args.minbytes, args.maxbytes, args.stepfactor):
        option, learning, baseline = measure(world, nbytes, args)
        total_learning += learning
        total_final += baseline
        if world.Get_rank() == 0:
            print(f"| {format_size(nbytes)} | {option} | {learning * 1e3:.2f} | {baseline * 1e3:.2f} | "
                  f"{(learning - baseline) * 1e3:+.2f} | {learning / baseline - 1:+.0%} |", flush=True)
    if world.Get_rank() == 0:
        print(f"\nall sizes: {total_learning * 1e3:.1f} ms learning, {total_final * 1e3:.1f} ms committed from the "
              f"start, {(total_learning - total_final) * 1e3:+.1f} ms extra")


if __name__ == "__main__":
    main()
