"""What a small allreduce costs in Python at the least, beside ringtree and native MPI. Two ranks.

    mpiexec -n 2 python scripts/small-message-floor.py [--count 2]

`floor` is the least any Python allreduce must do: check the arguments, one
Sendrecv with the other rank, and one add with numpy. Times are medians over
50 batches of 100 back-to-back calls, the slowest rank's.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

from ringtree.allreduce import allreduce
from ringtree.api.collective_args import prepared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2, help="float32 elements")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("run on 2 ranks")
    private = comm.Dup()
    other = 1 - comm.Get_rank()
    data = np.ones(args.count, np.float32)
    out, incoming = np.empty_like(data), np.empty_like(data)

    def floor():
        prepared("allreduce", comm, data, out, MPI.SUM)
        private.Sendrecv([data, MPI.BYTE], other, 7, [incoming, MPI.BYTE], other, 7)
        np.add(data, incoming, out=out)

    candidates = {
        "native": lambda: comm.Allreduce(data, out),
        "floor": floor,
        "ringtree auto": lambda: allreduce(data, out, comm=comm),
    }
    for name, call in candidates.items():
        for _ in range(200):
            call()
        batches = []
        for _ in range(50):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(100):
                call()
            batches.append((time.perf_counter() - start) / 100)
        slowest = comm.allreduce(float(np.median(batches)), MPI.MAX)
        if comm.Get_rank() == 0:
            print(f"{name:>14}: {slowest * 1e6:6.1f} us per call ({data.nbytes} bytes)")


if __name__ == "__main__":
    main()
