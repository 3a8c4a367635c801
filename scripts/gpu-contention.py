"""Where a small call on the CUDA IPC path spends its time, for ranks that share one GPU: a 1 MiB
copy within the device on one rank alone and on every rank at once (copyto's kernel and
cudaMemcpyAsync), an add, and ringtree's allreduce of 8 B and 1 MiB. Medians of calls started
together after a barrier, in microseconds, printed by rank 0. Run it under mpiexec on one node, with
and without MPS (nvidia-cuda-mps-control -d), to see what switching between the ranks' CUDA
contexts costs (docs/gpu.md, "Measured")."""

import argparse
import statistics
import sys
import time
from functools import partial

from mpi4py import MPI

from ringtree.allreduce import allreduce


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="", help="printed above the table")
    parser.add_argument("--calls", type=int, default=200, help="timed calls of each kind")
    args = parser.parse_args()
    try:
        import cupy
    except ImportError:
        sys.exit("gpu-contention.py needs CuPy and a GPU (pip install cupy-cuda13x)")
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    stream = cupy.cuda.get_current_stream()

    def median_us(work, only=None) -> float:
        times = []
        for _ in range(args.calls):
            comm.Barrier()
            start = time.perf_counter()
            if only is None or rank == only:
                work()
                stream.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    source = cupy.ones(1 << 18, cupy.float32)  # 1 MiB
    target = cupy.empty_like(source)
    stream.synchronize()
    memcpy = partial(target.data.copy_from_device_async, source.data, source.nbytes, stream)
    rows = {
        "copyto 1 MiB, rank 0 alone": median_us(partial(cupy.copyto, target, source), only=0),
        "copyto 1 MiB, every rank": median_us(partial(cupy.copyto, target, source)),
        "cudaMemcpyAsync 1 MiB, rank 0 alone": median_us(memcpy, only=0),
        "cudaMemcpyAsync 1 MiB, every rank": median_us(memcpy),
        "add 1 MiB, every rank": median_us(partial(cupy.add, source, source, out=target)),
    }
    for algorithm in ("tree", "ring", "auto"):
        rows[f"ringtree {algorithm} 1 MiB"] = median_us(partial(allreduce, source, target, algorithm=algorithm))
    rows["ringtree tree 8 B"] = median_us(partial(allreduce, source[:2], target[:2], algorithm="tree"))
    if rank == 0:
        print(f"{args.label} ({comm.Get_size()} ranks, medians of {args.calls} calls, µs)")
        for name, us in rows.items():
            print(f"  {name:40s} {us:9.1f}")


if __name__ == "__main__":
    main()
