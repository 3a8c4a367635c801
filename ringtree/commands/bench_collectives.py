"""`python -m ringtree bench --collective reduce_scatter|allgather|broadcast|reduce`: the other
collectives against the MPI library's own (Reduce_scatter_block, Allgather, Bcast, Reduce), in one
run, as bench does for allreduce.

With nccl-tests' conventions: the size is every block together (what a reduce-scatter sends, what
an allgather receives); busbw is algbw × (n-1)/n for allgather and reduce-scatter and algbw for
broadcast and reduce. Every algorithm's result is checked against native's on the same inputs
first (#wrong counts the elements that differ, on every rank together).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..ops import MPI_OP, ReduceOp
from .measure import across_ranks, in_pass_order, table_rows, time_in_turns

__all__ = ["run_collective", "measure", "NATIVE"]

NATIVE = "native"


def run_collective(args, comm) -> list[dict]:
    rank, size = comm.Get_rank(), comm.Get_size()
    name, dtype, op, algorithms = args.collective, args.dtype, args.reduce_op, args.algorithms
    baseline = NATIVE if NATIVE in algorithms else None
    # Every block of the same count: a size rounds down to a whole number of elements per rank.
    counts = sorted({max(1, nbytes // dtype.itemsize // size) * size for nbytes in args.sizes})
    reducing = name in ("reduce_scatter", "reduce")
    if rank == 0:
        print(f"# ringtree bench {name}: {size} ranks, {dtype}" + (f", {op.value}" if reducing else "")
              + f", {MPI.Get_library_version().splitlines()[0].strip()}"
              + (f", medians of {args.passes} passes" if args.passes > 1 else ""))
        print(f"# {'size':>10} {'count':>10} {'type':>8} {'redop':>5} {'algorithm':>18} {'time us':>10} "
              f"{'algbw GB/s':>10} {'busbw GB/s':>10} {'#wrong':>7} {'x ' + (baseline or '-'):>8}")
    cases = {algorithm: (algorithm, args.segment) for algorithm in algorithms}
    passes = {count: [] for count in counts}
    for k in range(args.passes):
        for count in in_pass_order(counts, k):
            passes[count].append(measure(comm, name, cases, count, dtype, op, args, args.warmup))
    rows = []
    for count in counts:
        rows += table_rows(comm, name, algorithms, count, dtype, op if reducing else None, passes[count], baseline)
    return rows


def _buffers(comm, name, count, dtype):
    """(input, output) of a call of `count` elements in all, and native's output for it."""
    rank, size = comm.Get_rank(), comm.Get_size()
    block = count // size
    data = (np.arange(count) % 7 + rank % 3 + 1).astype(dtype)  # small integers: any order adds them exactly
    if name == "reduce_scatter":
        return data, np.empty(block, dtype)
    if name == "allgather":
        return data[:block].copy(), np.empty(count, dtype)
    if name == "broadcast":
        return None, data
    return data, np.empty(count, dtype)


def _call(comm, name, algorithm, send, out, op, segment):
    """One call of the collective, of `send` into `out` (a broadcast: of `out`, from rank 0)."""
    if algorithm == NATIVE:
        mpi_op = MPI_OP[op] if op is not None else None
        divide = op is ReduceOp.AVG
        native = {"reduce_scatter": lambda: comm.Reduce_scatter_block(send, out, mpi_op),
                  "allgather": lambda: comm.Allgather(send, out),
                  "broadcast": lambda: comm.Bcast(out, 0),
                  "reduce": lambda: comm.Reduce(send, out, mpi_op, 0)}[name]
        if not divide:
            return native

        def averaged():
            native()
            if name == "reduce_scatter" or comm.Get_rank() == 0:
                out[...] /= comm.Get_size()
        return averaged
    options = dict(comm=comm, algorithm=algorithm, segment=segment)
    return {"reduce_scatter": lambda: collectives.reduce_scatter(send, out, None, op, **options),
            "allgather": lambda: collectives.allgather(send, out, **options),
            "broadcast": lambda: collectives.broadcast(out, 0, **options),
            "reduce": lambda: collectives.reduce(send, out, op, 0, **options)}[name]


def measure(comm, name, cases: dict, count, dtype, op, args, warmup: int = 0) -> tuple[dict, dict]:
    """Each case's median seconds per call, the slowest rank's, timed in turns, and the elements its
    result got wrong against native's (every rank's together), after `warmup` untimed calls of each.
    `cases`: label -> (algorithm, segment)."""
    send, out = _buffers(comm, name, count, dtype)
    original = out.copy()
    calls = {label: _call(comm, name, algorithm, send, out, op, segment) for label, (algorithm, segment) in cases.items()}
    _call(comm, name, NATIVE, send, out, op, None)()
    expected = out.copy()
    wrong = []
    for call in calls.values():
        out[...] = original
        for _ in range(warmup + 1):
            call()
        checked = name != "reduce" or comm.Get_rank() == 0  # a reduce's other ranks get nothing
        wrong.append(np.count_nonzero(out != expected) if checked else 0)
    wrong = dict(zip(cases, map(int, across_ranks(comm, wrong, MPI.SUM))))
    return time_in_turns(comm, calls, args.batch, args.iters, args.budget), wrong
