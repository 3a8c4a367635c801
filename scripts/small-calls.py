"""What a small call costs against MPI's own call of the same kind, the way programs make small calls.

    mpiexec -n 2 python scripts/small-calls.py [--sizes 8,64,1K,8K] [--iters 15] [--json FILE]

Cases, float64 (the ratio is ringtree's time over MPI's, in the same run):
  new array        allreduce(np.full(n, x)) against Allreduce into a new array
  two buffers      calls alternating between two pairs of arrays and two ops (sum, max)
  same buffers     allreduce(a, b) again and again against Allreduce(a, b)
  comm left out    the same, with comm left out (COMM_WORLD), as a program that has one communicator calls
  iallreduce       iallreduce(a, b).wait() against Iallreduce(a, b).Wait()
  persistent       allreduce_init's Start(); Wait() against MPI's Allreduce_init
  broadcast        broadcast(a, root=0) against Bcast(a, 0)
  broadcast new    broadcast(np.full(n, x), root=0) against Bcast of a new array
  reduce           reduce(a, b, root=0) against Reduce(a, b, root=0)
  reduce_scatter   reduce_scatter(s, a) against Reduce_scatter_block(s, a): n elements to each rank
  reduce_scatter new  reduce_scatter(np.full(...)) into a new result each call, against MPI's of new arrays
  allgather new    allgather(np.full(n, x)) into a new result each call, against Allgather of new arrays
  reduce new       reduce(np.full(n, x), root=0) into a new result each call, against Reduce of new arrays
  alltoall new     alltoall(np.full(...)) into a new result each call, against Alltoall of new arrays
  new input, same output   allreduce(np.full(n, x), b): a new input into the same result array
  reduce_scatter into new  reduce_scatter(np.full(...), np.empty(n)): new arrays, the result given
Every call is warmed up (past online tuning's trials) before timing; timing is bench's: turns in
shuffled order, medians of the slowest rank.
"""

import argparse
import json

import numpy as np
from mpi4py import MPI

import ringtree
from ringtree.commands.arguments import format_size, parse_size
from ringtree.commands.measure import time_in_turns

WARM_UP = 200


def persistent(request):
    def call():
        request.Start()
        request.Wait()
    return call


def cases(comm, count: int, requests: list) -> dict:
    """name -> (ringtree's call, MPI's call): functions of none; the persistent requests made for
    them go into `requests`, for the caller to free."""
    a, b = np.ones(count), np.empty(count)
    every = np.ones(count * comm.Get_size())  # a reduce-scatter's input: a block for each rank
    pairs = [(np.ones(count), np.empty(count)), (np.ones(count), np.empty(count))]
    turn = [0]
    ops = [(MPI.SUM, MPI.SUM), (MPI.MAX, MPI.MAX)]

    def alternating(ours: bool):
        def call():
            k = turn[0] = 1 - turn[0]
            (x, y), op = pairs[k], ops[k][0]
            if ours:
                ringtree.allreduce(x, y, op, comm=comm)
            else:
                comm.Allreduce(x, y, op)
        return call

    def native_new():
        x = np.full(count, 1.0)
        y = np.empty_like(x)
        comm.Allreduce(x, y)

    def native_scatter_new():
        comm.Reduce_scatter_block(np.full(count * comm.Get_size(), 1.0), np.empty(count))

    def native_gather_new():
        comm.Allgather(np.full(count, 1.0), np.empty(count * comm.Get_size()))

    def native_reduce_new():
        comm.Reduce(np.full(count, 1.0), np.empty(count), root=0)

    def native_into_given():
        comm.Allreduce(np.full(count, 1.0), b)

    def native_scatter_into_given():
        comm.Reduce_scatter_block(np.full(count * comm.Get_size(), 1.0), np.empty(count))

    def native_alltoall_new():
        comm.Alltoall(np.full(count * comm.Get_size(), 1.0), np.empty(count * comm.Get_size()))

    ours, theirs = ringtree.allreduce_init(a, b, comm=comm), comm.Allreduce_init(a, b)
    requests += [ours, theirs]
    return {
        "new array": (lambda: ringtree.allreduce(np.full(count, 1.0), comm=comm), native_new),
        "two buffers": (alternating(True), alternating(False)),
        "same buffers": (lambda: ringtree.allreduce(a, b, comm=comm), lambda: comm.Allreduce(a, b)),
        "comm left out": (lambda: ringtree.allreduce(a, b), lambda: comm.Allreduce(a, b)),
        "iallreduce": (lambda: ringtree.iallreduce(a, b, comm=comm).wait(), lambda: comm.Iallreduce(a, b).Wait()),
        "persistent": (persistent(ours), persistent(theirs)),
        "broadcast": (lambda: ringtree.broadcast(a, root=0, comm=comm), lambda: comm.Bcast(a, 0)),
        "broadcast new": (lambda: ringtree.broadcast(np.full(count, 1.0), root=0, comm=comm),
                          lambda: comm.Bcast(np.full(count, 1.0), 0)),
        "reduce": (lambda: ringtree.reduce(a, b, root=0, comm=comm), lambda: comm.Reduce(a, b, root=0)),
        "reduce_scatter": (lambda: ringtree.reduce_scatter(every, b, comm=comm),
                           lambda: comm.Reduce_scatter_block(every, b)),
        "reduce_scatter new": (lambda: ringtree.reduce_scatter(np.full(count * comm.Get_size(), 1.0), comm=comm),
                               native_scatter_new),
        "allgather new": (lambda: ringtree.allgather(np.full(count, 1.0), comm=comm), native_gather_new),
        "reduce new": (lambda: ringtree.reduce(np.full(count, 1.0), root=0, comm=comm), native_reduce_new),
        "alltoall new": (lambda: ringtree.alltoall(np.full(count * comm.Get_size(), 1.0), comm=comm),
                         native_alltoall_new),
        "new input, same output": (lambda: ringtree.allreduce(np.full(count, 1.0), b, comm=comm), native_into_given),
        "reduce_scatter into new": (lambda: ringtree.reduce_scatter(np.full(count * comm.Get_size(), 1.0),
                                                                    np.empty(count), comm=comm),
                                    native_scatter_into_given),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,64,1K,8K", help="comma-separated message sizes")
    parser.add_argument("--iters", type=int, default=15, help="turns per case (medians)")
    parser.add_argument("--json", help="also write the table's rows to this file")
    args = parser.parse_args()
    try:
        sizes = [parse_size(size) for size in args.sizes.split(",")]
    except ValueError as error:
        parser.error(str(error))
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    comm = MPI.COMM_WORLD
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // 8)
        calls, requests = {}, []
        made = cases(comm, count, requests)
        for name, (ours, native) in made.items():
            calls[name], calls[name + " (MPI)"] = ours, native
        for call in calls.values():
            for _ in range(WARM_UP):
                call()
        median = time_in_turns(comm, calls, 0.01, args.iters, 3.0)
        for request in requests:
            request.Free()
        for name in made:
            rows.append({"size": count * 8, "case": name, "ringtree_us": median[name] * 1e6,
                         "mpi_us": median[name + " (MPI)"] * 1e6, "ratio": median[name] / median[name + " (MPI)"]})
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} ranks, float64, medians of {args.iters} turns; ringtree / MPI's own\n")
        names = list(dict.fromkeys(row["case"] for row in rows))
        print("| case | " + " | ".join(format_size(n) for n in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for name in names:
            cells = [f"{row['ratio']:.2f}× ({row['ringtree_us']:.1f} / {row['mpi_us']:.1f} µs)"
                     for row in rows if row["case"] == name]
            print(f"| {name} | " + " | ".join(cells) + " |")
        if args.json:
            with open(args.json, "w") as file:
                json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
