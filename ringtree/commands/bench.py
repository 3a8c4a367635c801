"""`python -m ringtree bench`: a collective's bandwidth against the MPI library's own, in one run:
allreduce, or with --collective reduce_scatter, allgather, broadcast, reduce, alltoall or alltoallv
(against MPI's Reduce_scatter_block, Allgather, Bcast, Reduce, Alltoall and Alltoallv; alltoallv is
ringtree's alltoall given counts: rank s sends rank d 1 + (s + d) mod N shares of the size, so
that blocks differ while every rank sends and receives the size).

In the style of nccl-tests' all_reduce_perf. Run it under mpiexec. For every
size, each algorithm makes one call from the input, whose result is checked
against `native` (the MPI library's own Allreduce, as mpi4py calls it;
`native-path` is MPI's own through ringtree's call path, `algorithm="native"`,
as `auto` runs it) on the same data, and then its --warmup calls as the timing
runs them (an allreduce's `auto`: until online tuning's trials of its
candidates are over). Then the algorithms take turns,
repetition by repetition, in an order shuffled for each repetition, so drift
of a shared machine hits them alike. A turn is a barrier and then a batch of
back-to-back calls, as in nccl-tests (calls for about a millisecond, or
--batch seconds; a tiny --batch times calls one by one); its time per call is
the slowest rank's, and the table shows the median over repetitions. With --passes N the
whole grid is timed N times (every other pass from the largest size down) and
each case shows the median of its passes: on a shared machine whose speed
moves for seconds at a time, a size then rests on more than one moment.

With --cupy the buffers are CuPy arrays on the current GPU, and each call
ends when the GPU has finished it. `roundtrip` is then what a program without
ringtree does: copy to host memory, the MPI library's Allreduce there, copy
back; `native` hands MPI the device memory, which only a CUDA-aware MPI takes.

With nccl-tests' conventions for the other collectives: the size is every block together (what a
reduce-scatter sends, what an allgather receives, what an alltoall sends; a whole number of elements
per rank); busbw is algbw × (n-1)/n for allgather, reduce-scatter and alltoall and algbw for
broadcast and reduce.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import numpy as np
from mpi4py import MPI

from ..algorithms import ALGORITHMS, GENERATORS
from ..api import collectives
from ..api.allreduce import allreduce
from ..ops import MPI_OP, ReduceOp, check_dtype, parse_op
from ..runtime.session.state import existing_state
from ..runtime.transports.backend import NoDevice, cupy_backend
from ..runtime.transports.cuda import cuda_support
from ..tuning.online import NATIVE
from ..words import counted
from .arguments import (
    REDUCING,
    UsageError,
    add_import_argument,
    algorithm_names,
    at_least,
    comma_list,
    dtype,
    not_its_algorithms,
    output_path,
    parse_size,
    positive,
    sizes_from_args,
)
from .measure import (
    UNEVEN,
    across_ranks,
    exact_data,
    exact_inputs,
    in_pass_order,
    kind_of,
    table_rows,
    time_in_turns,
    whole_elements,
)

ROUNDTRIP = "roundtrip"
NATIVE_PATH = "native-path"  # MPI's own through ringtree's call path (algorithm="native"), as `auto` runs it
COLLECTIVES = [*GENERATORS, *UNEVEN]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_import_argument(parser)
    parser.add_argument("-b", "--minbytes", type=at_least(1, parse_size), default=parse_size("8"),
                        help="smallest size (e.g. 8, 1K, 4M)")
    parser.add_argument("-e", "--maxbytes", type=at_least(1, parse_size), default=parse_size("256M"), help="largest size")
    parser.add_argument("-f", "--stepfactor", type=at_least(2), default=2, help="multiply the size by this at each step")
    parser.add_argument("--collective", choices=COLLECTIVES, default="allreduce",
                        help="the collective to time (with nccl-tests' size and busbw for each)")
    parser.add_argument("--algorithms", type=comma_list([*algorithm_names(), "auto", NATIVE, NATIVE_PATH, ROUNDTRIP]),
                        default=None,
                        help=f"comma-separated, from {', '.join(ALGORITHMS)} (allreduce's; another collective's: "
                             "ringtree.algorithms.GENERATORS), auto, native (mpi4py's call of MPI's own), native-path "
                             "(MPI's own through ringtree's path, as auto runs it: algorithm=\"native\"), and with --cupy "
                             "roundtrip (default: ring,tree,auto,native; another collective's: all of its, auto, native)")
    parser.add_argument("--cupy", action="store_true", help="CuPy arrays on the GPU instead of numpy arrays")
    parser.add_argument("--dtype", type=dtype, default="float32", help="numpy dtype name")
    parser.add_argument("--op", choices=["sum", "prod", "min", "max", "avg"],
                        help=f"the reduction of {', '.join(REDUCING)} (default: sum); the others reduce nothing")
    parser.add_argument("--inplace", action="store_true", help="MPI.IN_PLACE instead of separate buffers")
    parser.add_argument("--segment", type=at_least(1, parse_size), default=None,
                        help="segment size in bytes (default: selector's)")
    parser.add_argument("--iters", type=at_least(1), default=20, help="timed repetitions per size (fewer for big sizes)")
    parser.add_argument("--warmup", type=at_least(0), default=3, help="untimed repetitions per size")
    parser.add_argument("--batch", type=positive, default=1e-3,
                        help="seconds of back-to-back calls per timed repetition (longer averages out more noise)")
    parser.add_argument("--budget", type=positive, default=2.0,
                        help="seconds per size and algorithm, at most, once warm; lowers --iters for big sizes")
    parser.add_argument("--passes", type=at_least(1), default=1,
                        help="times over the whole grid; a case's time is the median over passes")
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the rows as JSON")
    parser.add_argument("--note", default="", help="a line about the machine, kept in the JSON (e.g. '2-core VM')")


def check(args: argparse.Namespace) -> None:
    """UsageError for arguments that do not go together."""
    sizes_from_args(args)
    known = {name: algorithm for name, algorithm in GENERATORS[UNEVEN.get(args.collective, args.collective)].items()
             if args.collective not in UNEVEN or name != "bruck"}  # Bruck takes blocks alike only
    kind = kind_of(args.collective)
    if args.algorithms is None:
        args.algorithms = [*(kind.bench_algorithms or sorted(known)), "auto", NATIVE]
    unknown = [name for name in args.algorithms if name not in (*known, "auto", NATIVE, NATIVE_PATH, ROUNDTRIP)]
    if unknown:
        raise not_its_algorithms(args.collective, unknown, [*sorted(known), "auto", NATIVE, NATIVE_PATH])
    if NATIVE_PATH in args.algorithms and (args.cupy or args.collective in UNEVEN):
        raise UsageError(f"'{NATIVE_PATH}' runs numpy arrays in blocks alike: leave out --cupy and alltoallv")
    if args.op is not None and args.collective not in REDUCING:
        raise UsageError(f"--op {args.op}: {args.collective} reduces nothing; --op goes with {', '.join(REDUCING)}")
    args.op = args.op or "sum"
    if not kind.whole_sizes and (args.cupy or args.inplace):
        raise UsageError(f"--collective {args.collective} times numpy arrays out of place; leave out --cupy and "
                         "--inplace")
    try:
        if args.collective in REDUCING:
            check_dtype(args.dtype, parse_op(args.op))
    except TypeError as error:
        raise UsageError(f"--op {args.op} --dtype {args.dtype}: {error}") from None
    if ROUNDTRIP in args.algorithms and not args.cupy:
        raise UsageError(f"'{ROUNDTRIP}' copies CuPy arrays to the host: it goes with --cupy")
    if args.dtype == np.float16 and {NATIVE, NATIVE_PATH, ROUNDTRIP} & set(args.algorithms):
        raise UsageError("native MPI has no float16 reduction; leave out 'native', 'native-path' and 'roundtrip' or "
                         "pick another dtype")
    if args.cupy:
        try:
            cupy_backend()
        except ImportError:
            raise UsageError("--cupy needs CuPy: pip install cupy-cuda13x (or cupy-cuda12x)") from None
        except NoDevice as error:
            raise UsageError(f"--cupy: {error}") from None
        if NATIVE in args.algorithms and not cuda_support().aware:
            raise UsageError(f"native MPI cannot take device memory: the MPI is not CUDA-aware "
                             f"({cuda_support().reason}); compare with '{ROUNDTRIP}' instead")


def run(args: argparse.Namespace) -> list[dict]:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    name, dtype, op, algorithms = args.collective, args.dtype, parse_op(args.op), args.algorithms
    redop = op if name in REDUCING else None  # as the table shows it
    baseline = next((case for case in (NATIVE, ROUNDTRIP) if case in algorithms), None)
    # every block of the same count (or share): a size rounds down to a whole number of them per rank
    kind = kind_of(name)
    shares = 1 if kind.whole_sizes else size * (size + 1) // 2 if name in UNEVEN else size
    counts, rounded = whole_elements(sizes_from_args(args), dtype, shares, "" if kind.whole_sizes else (
        f"in {name}'s {shares} shares" if name in UNEVEN else f"per rank on {counted(size, 'rank')}"))
    if rank == 0:
        print(f"# ringtree bench{' ' + name if kind.named else ''}: {counted(size, 'rank')}, {dtype}"
              + (f", {op.value}" if redop is not None else "")
              + (f", {'in place' if args.inplace else 'out of place'}" if kind.whole_sizes else "")
              + f", {'CuPy arrays, ' if args.cupy else ''}{MPI.Get_library_version().splitlines()[0].strip()}"
              + (f", medians of {args.passes} passes" if args.passes > 1 else ""))
        if rounded:
            print(f"# {rounded}")
        print(f"# {'size':>10} {'count':>10} {'type':>8} {'redop':>5} {'algorithm':>18} {'time us':>10} "
              f"{'algbw GB/s':>10} {'busbw GB/s':>10} {'#wrong':>7} {'x ' + (baseline or '-'):>8}")
    progress = None
    if rank == 0 and args.passes > 1:  # the table comes at the end: show the passes going by, on a terminal
        from tqdm import tqdm
        progress = tqdm(total=args.passes * len(counts), unit="size", desc="bench", leave=False, disable=None)
    cases = {case: (case, args.segment) for case in algorithms}
    rows = []
    passes = {count: [] for count in counts}  # per pass: ({algorithm: seconds}, {algorithm: wrong elements})
    for k in range(args.passes):
        for count in in_pass_order(counts, k):
            passes[count].append(measure(comm, name, cases, count, dtype, op, args, args.warmup))
            if args.passes == 1:
                rows += table_rows(comm, name, algorithms, count, dtype, redop, passes[count], baseline)
            elif progress is not None:
                progress.update()
    if args.passes > 1:
        if progress is not None:
            progress.close()
        for count in counts:
            rows += table_rows(comm, name, algorithms, count, dtype, redop, passes[count], baseline)
    return _written(args, comm, rows, baseline)


def _written(args, comm, rows: list[dict], baseline) -> list[dict]:
    """The rows, also as JSON with --json; SystemExit where a result differs from native's."""
    if args.json and comm.Get_rank() == 0:
        with open(args.json, "w") as f:
            json.dump({"collective": args.collective, "ranks": comm.Get_size(), "dtype": str(args.dtype),
                       "op": args.op if args.collective in REDUCING else None, "inplace": args.inplace,
                       "arrays": "cupy" if args.cupy else "numpy",
                       "baseline": baseline, "passes": args.passes,
                       "mpi": MPI.Get_library_version().splitlines()[0].strip(), "note": args.note,
                       "rows": rows}, f, indent=1)
        print(f"# wrote the rows as JSON to {args.json}")
    if any(row["wrong"] for row in rows):
        raise SystemExit(f"rank {comm.Get_rank()}: some results differ from native MPI (see #wrong)")
    return rows


def measure(comm, name, cases: dict, count, dtype, op, args, warmup: int = 0) -> tuple[dict, dict]:
    """Each case's median seconds per call, the slowest rank's, timed in turns after `warmup` untimed
    calls of each, and the elements its result got wrong against MPI's own on the same inputs (every
    rank's together). `cases`: label -> (algorithm, segment).

    The warm-up calls run as the timed ones do (time_in_turns), in batches of back-to-back calls
    (in place, each on the last one's result): `auto`'s online tuning times its trials there, and
    ringtree's engine takes up to 2x as long in place on the last call's result as on input the
    program just wrote (docs/performance.md), so trials on restored input chose for another
    pattern; and a call after a barrier takes another time than one right after the last. An
    allreduce's `auto` warms up until its trials are over: the table shows what it chose, not
    the candidates it tried."""
    inplace, cupy = getattr(args, "inplace", False), getattr(args, "cupy", False)  # tune's arguments have neither
    send, out, expected = _buffers(comm, name, count, dtype, op, cupy)
    original = out.copy()
    calls = {label: _call(comm, name, algorithm, send, out, op, segment, inplace, cupy)
             for label, (algorithm, segment) in cases.items()}
    checked = _receives(comm, name)
    wrong = []
    # In place every call adds into the last result, so the values grow until they overflow to inf,
    # which changes neither the work nor its time: numpy need not warn about it.
    with np.errstate(over="ignore" if inplace else "warn"):
        for call in calls.values():
            out[...] = original  # the checked call starts from the input
            call()
            got = out.get() if cupy else out
            wrong.append(np.count_nonzero(got != expected) if checked else 0)
        wrong = dict(zip(cases, map(int, across_ranks(comm, wrong, MPI.SUM))))
        tuned = {label: partial(_tuned, comm) for label, (algorithm, _) in cases.items()
                 if algorithm == "auto" and kind_of(name).modelled}
        return time_in_turns(comm, calls, args.batch, args.iters, args.budget, warmup, tuned), wrong


def _receives(comm, name: str) -> bool:
    """Whether this rank gets a result (a reduce's other ranks than rank 0, its root, get nothing)."""
    kind = kind_of(name)
    return not (kind.rooted and kind.reduces) or comm.Get_rank() == 0


def _tuned(comm) -> bool:
    """Whether online tuning on `comm` has no trials under way (or does not tune)."""
    state = existing_state(comm)
    return state is None or state.tuner is None or not state.tuner.explorations


def _buffers(comm, name, count, dtype, op, cupy: bool):
    """(input, output, MPI's own result on host memory) of a call of `count` elements in all: small
    integers, which every order of a sum adds to the same bits. A broadcast's input is its output
    at rank 0; an allreduce's output starts as its input (its buffer in place)."""
    data, expected = exact_inputs(comm, count, dtype, op) if kind_of(name).whole_sizes else (
        exact_data(comm, count, dtype), None)
    block = count // comm.Get_size()
    send, out = {"allreduce": (data, data.copy()), "reduce_scatter": (data, np.empty(block, dtype)),
                 "allgather": (data[:block].copy(), np.empty(count, dtype)), "broadcast": (None, data),
                 "reduce": (data, np.empty(count, dtype)), "alltoall": (data, np.empty(count, dtype)),
                 "alltoallv": (data, np.empty(count, dtype))}[name]
    if expected is None:
        original = out.copy()
        _call(comm, name, NATIVE, send, out, op, None)()
        expected, out[...] = out.copy(), original
    if cupy:
        import cupy as cp
        send, out = cp.asarray(send), cp.asarray(out)
    return send, out, expected


def _call(comm, name, algorithm, data, out, op, segment, inplace: bool = False, cupy: bool = False):
    """A function running one call of the collective of `data` into `out` (a broadcast: of `out`, from
    rank 0; an allreduce `inplace`: of `out` into itself); with `cupy`, one that returns once the GPU
    has finished it."""
    if algorithm == ROUNDTRIP:
        return _roundtrip(comm, data, out, op, inplace)
    send = MPI.IN_PLACE if inplace else data
    sent, received = _uneven(comm, out.size) if name in UNEVEN else ((), ())
    if algorithm == NATIVE:
        mpi_op = MPI_OP.get(op)
        native = {"allreduce": lambda: comm.Allreduce(send, out, mpi_op),
                  "reduce_scatter": lambda: comm.Reduce_scatter_block(send, out, mpi_op),
                  "allgather": lambda: comm.Allgather(send, out),
                  "broadcast": lambda: comm.Bcast(out, 0),
                  "reduce": lambda: comm.Reduce(send, out, mpi_op, 0),
                  "alltoall": lambda: comm.Alltoall(send, out),
                  "alltoallv": partial(comm.Alltoallv, [send, sent], [out, received])}[name]
        call = native
        if op is ReduceOp.AVG and name in REDUCING and _receives(comm, name):
            def call():
                native()
                out[...] /= comm.Get_size()
    else:
        options = dict(comm=comm, algorithm=NATIVE if algorithm == NATIVE_PATH else algorithm, segment=segment)
        call = {"allreduce": lambda: allreduce(send, out, op, **options),
                "reduce_scatter": lambda: collectives.reduce_scatter(send, out, None, op, **options),
                "allgather": lambda: collectives.allgather(send, out, **options),
                "broadcast": lambda: collectives.broadcast(out, 0, **options),
                "reduce": lambda: collectives.reduce(send, out, op, 0, **options),
                "alltoall": lambda: collectives.alltoall(send, out, **options),
                "alltoallv": lambda: collectives.alltoall(send, out, sent, received, **options)}[name]
    if not cupy:
        return call
    import cupy as cp

    def until_done():
        call()
        cp.cuda.get_current_stream().synchronize()
    return until_done


def _uneven(comm, count: int) -> tuple[list[int], list[int]]:
    """alltoallv's (sendcounts, recvcounts) of `count` elements a rank: rank s sends rank d 1 + (s + d) mod N
    shares, which add up to the same in every row and column."""
    n, r = comm.Get_size(), comm.Get_rank()
    share = count // (n * (n + 1) // 2)
    return [share * (1 + (r + d) % n) for d in range(n)], [share * (1 + (s + r) % n) for s in range(n)]


def _roundtrip(comm, data, out, op, inplace):
    """Copy to host memory, the MPI library's Allreduce there, copy back: a CuPy program's plain way."""
    host_in, host_out = np.empty(data.shape, data.dtype), np.empty(data.shape, data.dtype)
    native_op = MPI_OP[op]

    def roundtrip():
        (out if inplace else data).get(out=host_in)
        comm.Allreduce(host_in, host_out, native_op)
        if op is ReduceOp.AVG:
            host_out[...] /= comm.Get_size()
        out.set(host_out)
    return roundtrip


