"""A training loop that loses a rank and goes on with the others.

    mpiexec --with-ft ulfm --mca btl self,tcp -n 4 python examples/shrink.py --fail-rank 1 --fail-step 3

Needs an MPI with ULFM fault tolerance: Open MPI's `--with-ft ulfm` (its
shared-memory transport does not report failures, hence `--mca btl self,tcp`).
Each step averages a "gradient" over the ranks with ringtree. At --fail-step,
--fail-rank exits without a word; the others get ringtree.PeerFailure naming
it, shrink the communicator to the survivors, and carry on. Every survivor
checks each step's average against the value the survivors' inputs give.
"""

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

import ringtree
from ringtree.allreduce import allreduce


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--fail-step", type=int, default=3)
    parser.add_argument("--size", type=int, default=1 << 16, help="elements per gradient")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()  # the rank in COMM_WORLD names a process for the whole run
    step = 0
    while step < args.steps:
        if step == args.fail_step and me == args.fail_rank:
            os._exit(1)  # a crash: no message, no MPI_Finalize
        gradient = np.full(args.size, float(me + step), np.float64)
        try:
            average = allreduce(gradient, op="avg", comm=comm)
        except ringtree.PeerFailure as failure:
            gone = [comm.group.Translate_ranks([r], MPI.COMM_WORLD.group)[0] for r in failure.failed]
            print(f"rank {me}, step {step}: {failure}", flush=True)
            comm = comm.Shrink()
            print(f"rank {me}: lost world rank(s) {gone}; going on with {comm.Get_size()} ranks", flush=True)
            continue  # redo this step with the survivors
        members = comm.group.Translate_ranks(list(range(comm.Get_size())), MPI.COMM_WORLD.group)
        expected = np.mean([r + step for r in members])
        if not np.allclose(average, expected):
            sys.exit(f"rank {me}, step {step}: average {average[0]} != {expected}")
        step += 1
    print(f"rank {me}: {args.steps} steps done on {comm.Get_size()} ranks, every average right", flush=True)
    if comm.Get_size() < MPI.COMM_WORLD.Get_size():
        # Open MPI's MPI_Finalize may wait for the dead rank forever (open-mpi/ompi#11404; here about
        # one run in ten): after a failure, leave without it. The first rank to leave so ends the job,
        # killing any survivor still short of its last line (4 runs in 10 here): wait for all.
        comm.Barrier()
        os._exit(0)


if __name__ == "__main__":
    main()
