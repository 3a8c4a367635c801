"""Threads that call ringtree on one communicator at once (an error in MPI): each rank prints, per
thread, whether it got ringtree's error for it and how many of its results were wrong.

    mpiexec -n 2 python scripts/threads-on-one-communicator.py [--start new|after-call] [--threads 2]
                                                                [--count 100000] [--calls 30]

Each thread's inputs are its own, so that a result of the other thread's call on another rank
shows as wrong. `--start new`: the threads' calls are the first on the communicator; `after-call`:
the main thread made one first. Every rank's line reads "rank R: two threads named, 0 wrong" when
every thread raised the error and no result was wrong.
"""

import argparse
import threading

import numpy as np
from mpi4py import MPI

import ringtree
from ringtree.allreduce import allreduce


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", choices=["new", "after-call"], default="new")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--count", type=int, default=100_000, help="float64 elements per call")
    parser.add_argument("--calls", type=int, default=30, help="per thread")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    if args.start == "after-call":
        allreduce(np.ones(4), comm=comm)
    outcomes = []

    def work(k):
        data = np.full(args.count, float((k + 1) * (rank + 1)))
        wrong = 0
        try:
            for _ in range(args.calls):
                wrong += int(allreduce(data, comm=comm)[0] != (k + 1) * size * (size + 1) / 2)
            outcomes.append(f"no error, {wrong} wrong")
        except ringtree.MismatchError as error:
            named = "two threads were in calls on it at once" in str(error)
            outcomes.append(f"{'two threads named' if named else error}, {wrong} wrong")
        except Exception as error:  # anything else is a failure to report, not to hide
            outcomes.append(f"{type(error).__name__}: {error}, {wrong} wrong")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    different = sorted(set(outcomes))
    print(f"rank {rank}: {different[0] if len(different) == 1 else different}", flush=True)


if __name__ == "__main__":
    main()
