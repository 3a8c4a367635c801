"""Peak extra memory of one allreduce, per rank: what ringtree allocates beyond the user's buffers.

    mpiexec -n 2 python scripts/peak-memory.py --size 256M [--out-of-place]

tracemalloc sees every numpy allocation (scratch, views, temporaries); the
resident set size (ru_maxrss) also sees MPI's own buffers.
"""

import argparse
import resource
import tracemalloc

import numpy as np
from mpi4py import MPI

from ringtree.allreduce import allreduce
from ringtree.commands.arguments import parse_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("256M"), help="bytes of float32 per rank")
    parser.add_argument("--algorithm", default="ring")
    parser.add_argument("--out-of-place", action="store_true")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    data = np.ones(args.size // 4, np.float32)
    out = None if not args.out_of_place else np.empty_like(data)
    data.fill(comm.Get_rank())  # touch every page before measuring
    if out is not None:
        out.fill(0)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    allreduce(data if out is not None else MPI.IN_PLACE, out if out is not None else data, algorithm=args.algorithm)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024
    for rank, (traced, rss) in enumerate(comm.gather((peak, rss_growth)) or []):
        print(f"rank {rank}: {args.size / 2**20:.0f} MiB {'out of place' if out is not None else 'in place'} "
              f"{args.algorithm}: tracemalloc peak {traced / 2**20:.2f} MiB, peak RSS growth {rss / 2**20:.2f} MiB")


if __name__ == "__main__":
    main()
