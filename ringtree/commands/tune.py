"""`python -m ringtree tune`: measure every algorithm on this machine and write a tuning table.

Run it under mpiexec with the rank count to tune for. For each size of the
grid it times every algorithm, unsplit and with a few segment sizes, in turns
as the bench does (a barrier, then a batch of calls; the slowest rank's time
per call; the median over repetitions in shuffled order), checking each result
against the MPI library's own allreduce. It goes over the grid twice, up and
then down, and averages. It then fits the α-β-γ model to all the timings, prints which
algorithm wins from which size, and writes the rules for this rank count into
the table file, keeping the rules it holds for other rank counts. Native MPI
is timed at each size too, a candidate like the others: where it is fastest,
the rule takes MPI's own allreduce, with ringtree's fastest algorithm for the
calls MPI cannot reduce (float16, "avg", GPU arrays). The fastest case at each
size also goes into the tuning cache (RINGTREE_CACHE_DIR), in the format online
tuning writes, so a later job on these hosts and ranks starts from it. The
table rules only the sizes of the grid: others go to online tuning, else to
the model.

With --merge it re-tunes only the sizes of its grid, in a table that already
has rules for this rank count: each algorithm runs with the table's segment
size for it, the rules for sizes above the grid point below -b up to -e are
replaced, and the table's rules for smaller and larger sizes stay.

With --collective reduce_scatter, allgather, broadcast, reduce or alltoall it tunes that
collective instead, into the same file, the same way (its size is every block
together; a size rounds down to a whole number of elements per rank), with
rules by size alone for this rank count: those of the fastest case, MPI's own
among them ("rules"), and those of ringtree's fastest ("without_native", for the
calls MPI's own cannot run: device memory, a reduction MPI lacks, a call with a
timeout). With RINGTREE_TUNING_FILE naming the file, `auto` takes them (a size
past the largest measured, the last rule's choice), and those of the packaged
table for the collectives the file has none of.

    mpiexec -n 2 python -m ringtree tune -o tuning.json
    RINGTREE_TUNING_FILE=tuning.json mpiexec -n 2 python my_training.py
    mpiexec -n 2 python -m ringtree tune -b 8M -e 32M --merge -o tuning.json
    mpiexec -n 2 python -m ringtree tune --collective reduce_scatter -b 64K -e 64M -o tuning.json
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

from .. import settings
from ..algorithms import GENERATORS, REGISTRY, SHIPPED, offered
from ..ops import ReduceOp
from ..runtime.session.state import cache_identity, comm_state
from ..schedule.collectives import COLLECTIVES
from ..tuning import cache
from ..tuning.model import fit, fit_error
from ..tuning.online import NATIVE, Option, key_of
from ..words import counted
from .arguments import (
    UsageError,
    add_import_argument,
    algorithm_names,
    at_least,
    comma_list,
    format_size,
    not_its_algorithms,
    output_path,
    parse_size,
    positive,
    size_list,
    sizes_from_args,
    warn,
)
from .bench import NATIVE_PATH, measure
from .measure import COSTS, candidates, in_pass_order, poor_fit, smoothed, whole_elements
from .table_file import (
    NotATable,
    case_of,
    layout_key,
    layout_of,
    measured_key,
    merged_rules,
    read_table,
    rules_from,
    segments_from,
    size_rules,
    winners_from,
    write_table,
    write_table_file,
)

SEGMENTS = (1 << 20, 2 << 20, 4 << 20, 16 << 20)  # allreduce's
SEGMENTS_OF_COLLECTIVES = (256 << 10, 1 << 20, 4 << 20)
NATIVE_CASE = (NATIVE, 0)  # timed at every size too, as `auto` runs it: through ringtree's call path
UNSPLIT = 1 << 62  # a segment no message reaches
DTYPE = np.dtype(np.float32)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_import_argument(parser)
    parser.add_argument("-b", "--minbytes", type=at_least(1, parse_size), default=parse_size("8"), help="smallest size")
    parser.add_argument("-e", "--maxbytes", type=at_least(1, parse_size), default=parse_size("256M"), help="largest size")
    parser.add_argument("-f", "--stepfactor", type=at_least(2), default=2, help="multiply the size by this at each step")
    parser.add_argument("--collective", choices=list(GENERATORS), default="allreduce",
                        help="the collective to tune")
    parser.add_argument("--algorithms", type=comma_list(algorithm_names()), default=None,
                        help="comma-separated algorithms to try (default: every one of the collective that auto may "
                             "choose: ringtree's own, and those --import offers to auto)")
    parser.add_argument("--segments", type=size_list, default=None,
                        help="segment sizes to try where a message is larger (default: "
                             f"{', '.join(map(format_size, SEGMENTS))}; another collective's: "
                             f"{', '.join(map(format_size, SEGMENTS_OF_COLLECTIVES))})")
    parser.add_argument("--passes", type=at_least(1), default=2, help="times over the whole grid, averaged")
    parser.add_argument("--iters", type=at_least(1), default=15, help="timed repetitions per size (fewer for big sizes)")
    parser.add_argument("--batch", type=positive, default=0.01, help="seconds of back-to-back calls per repetition")
    parser.add_argument("--budget", type=positive, default=0.5,
                        help="seconds per size and case, at most, once warm; lowers --iters for big sizes")
    parser.add_argument("-o", "--output", type=output_path, default="ringtree-tuning.json",
                        help="table file to write; rules for other rank counts already in it are kept")
    parser.add_argument("--note", default="", help="where this was measured (e.g. '2-core VM'), kept in the file")
    parser.add_argument("--merge", action="store_true",
                        help="re-tune only this grid's sizes in the table's rules for this rank count, with the "
                             "table's segment sizes; its rules for other sizes stay")


def check(args: argparse.Namespace) -> None:
    """UsageError for arguments that do not go together; the collective's defaults filled in."""
    known = GENERATORS[args.collective]
    if args.algorithms is None:
        args.algorithms = offered(args.collective)
    unknown = [name for name in args.algorithms if name not in known]
    if unknown:
        raise not_its_algorithms(args.collective, unknown, list(known))
    modelled = COLLECTIVES[args.collective].modelled
    if modelled and not set(args.algorithms) & set(SHIPPED[args.collective]):
        raise UsageError(f"--algorithms: the α-β-γ model is fitted to ringtree's own {args.collective} algorithms: "
                         f"name one of {', '.join(SHIPPED[args.collective])} as well")
    if args.segments is None:
        args.segments = list(SEGMENTS if modelled else SEGMENTS_OF_COLLECTIVES)
    if args.merge and not modelled:
        raise UsageError(f"--merge re-tunes allreduce's rules; --collective {args.collective} tunes its whole grid")


def run(args: argparse.Namespace) -> None:
    comm = MPI.COMM_WORLD
    name, rank, nranks = args.collective, comm.Get_rank(), comm.Get_size()
    kind = COLLECTIVES[name]
    layout = layout_of(comm_state(comm).topology)
    table = _existing_table(comm, args.output, layout if args.merge else None)  # before measuring anything
    kept_segments = table["segments"][str(nranks)] if args.merge else None
    # every block of the same count: a size rounds down to a whole number of elements per rank
    grid, rounded = whole_elements(sizes_from_args(args), DTYPE, 1 if kind.whole_sizes else nranks,
                                   "" if kind.whole_sizes else f"per rank on {counted(nranks, 'rank')}")
    counts = {count * DTYPE.itemsize: count for count in grid}
    if rank == 0 and rounded:
        print(f"note: {rounded}")

    def cases(nbytes: int) -> dict:
        found = (candidates(nbytes, args.algorithms, args.segments) if kept_segments is None
                 else [case_of(alg, nbytes, kept_segments) for alg in args.algorithms])
        return {NATIVE_CASE: (NATIVE_PATH, None), **{case: (case[0], case[1] or UNSPLIT) for case in found}}

    progress = None
    if rank == 0:
        from tqdm import tqdm
        progress = tqdm(total=args.passes * sum(len(cases(nbytes)) for nbytes in counts), unit="case",
                        desc=f"tune {name} {counted(nranks, 'rank')}")
    # Each pass times the whole grid, the second from the largest size down; a case's time is the
    # mean over passes, so a choice rests on the machine at more than one moment.
    passes: dict[int, list[dict]] = {nbytes: [] for nbytes in counts}
    for k in range(args.passes):
        for nbytes in in_pass_order(list(counts), k):
            times, wrong = measure(comm, name, cases(nbytes), counts[nbytes], DTYPE, ReduceOp.SUM, args)
            if any(wrong.values()):
                raise SystemExit(f"tune: {name} results differ from native MPI at {nbytes} B: "
                                 f"{[case for case, n in wrong.items() if n]}")
            passes[nbytes].append(times)
            if progress is not None:
                progress.update(len(times))
    if progress is not None:
        progress.close()
    who = cache_identity(comm, comm_state(comm).topology) if kind.modelled else None
    if rank != 0:
        return
    mean = {nbytes: {case: float(np.mean([p[case] for p in runs])) for case in runs[0]}
            for nbytes, runs in passes.items()}
    try:
        if kind.modelled:
            _write_allreduce(args, nranks, layout, table, kept_segments, mean, who)
        else:
            _write_collective(args, name, nranks, mean)
    except (NotATable, OSError) as error:  # the file changed while tune measured
        raise SystemExit(f"tune: cannot write {args.output}: {error}") from None


def _write_allreduce(args, nranks: int, layout: dict, table: dict | None, kept_segments: dict | None, mean: dict,
                     who: dict) -> None:
    """allreduce's rules for this layout from the mean times (`mean`: size -> case -> seconds), with
    the model fitted to them and each algorithm's segment size, into the table; the fastest at each
    size into the tuning cache."""
    algorithms, sizes = args.algorithms, list(mean)
    if settings.current().tune != "off":
        _keep_in_cache(who, mean)
    measured = [(alg, nranks, nbytes, seg, seconds) for nbytes, timed in mean.items() for (alg, seg), seconds in timed.items()]
    if args.merge:  # the times of the sizes not re-tuned stay, and the model is fitted to all
        measured += [(m["algorithm"], nranks, m["bytes"], m["segment"], m["seconds"])
                     for m in table["measured"].get(measured_key(layout), []) if m["bytes"] not in mean]
    ours = [m for m in measured if m[0] != NATIVE]  # ringtree's: what the segments are fitted to
    modelled = [m for m in ours if m[0] in SHIPPED["allreduce"]]  # and the model (a program's own has none)
    params = fit(modelled)
    # One segment size per algorithm, then one algorithm per size: auto then runs exactly what a call
    # naming that algorithm runs, and the table has fewer knobs to fit to noise.
    best_segments = kept_segments or segments_from(ours)
    winners = winners_from(mean, [*algorithms, NATIVE], best_segments, winners_from(mean, algorithms, best_segments))
    if args.merge:
        below = sizes[0] // args.stepfactor if sizes[0] >= args.stepfactor else -1  # the grid point below
        rules = merged_rules([rule for rule in table["rules"] if layout_key(rule) == layout_key(layout)],
                             rules_from(winners, layout, below), below, sizes[-1])
    else:
        rules = rules_from(winners, layout)
    print(f"\nfitted α = {params.alpha * 1e6:.2f} µs, β = {params.beta * 1e9:.3f} ns/B "
          f"({1e-9 / params.beta if params.beta else float('inf'):.2f} GB/s), γ = {params.gamma * 1e9:.3f} ns/B")
    poor = poor_fit("the α-β-γ model", [COSTS[name] for name, value in params._asdict().items() if value <= 0],
                    fit_error(modelled, params))
    if poor:
        warn(f"{poor}. The model only rules the sizes and rank counts the table does not")
    print(f"\n{counted(nranks, 'rank')}: which algorithm wins from which size")
    print(f"{'from':>10} {'to':>10}  {'algorithm':<19} segment")
    for rule in rules:
        low, high = rule["bytes"]
        otherwise = rule.get("without_native")
        print(f"{low:>10} {high if high is not None else '…':>10}  "
              f"{'MPI' + chr(39) + 's own' if otherwise else rule['algorithm']:<19} "
              f"{format_size(rule['segment']) if rule['segment'] else 'unsplit'}"
              + (f"  (where MPI cannot reduce the call: {otherwise['algorithm']}, "
                 f"{format_size(otherwise['segment']) if otherwise['segment'] else 'unsplit'})" if otherwise else ""))
    print("\nsegment size for an algorithm named in a call: " + (
        ", ".join(f"{name} {format_size(segment)}" for name, segment in best_segments.items()) if best_segments else
        f"not measured (no size of the grid is cut in segments), so each algorithm's default "
        f"({format_size(REGISTRY['allreduce']['ring'].segment)})"))
    write_table(args.output, layout, rules, params, best_segments, args.note, measured)
    covered = [rule["bytes"] for rule in rules]
    print(f"\nthe table rules sizes up to {format_size(covered[-1][1])} on {counted(nranks, 'rank')}; "
          "other sizes go to online tuning (RINGTREE_TUNE=online, the default), else to the fitted model")
    print(f"wrote {args.output}; use it with RINGTREE_TUNING_FILE={args.output}")


def _write_collective(args, name: str, nranks: int, mean: dict) -> None:
    """Another collective's rules for this rank count from the mean times (`mean`: size -> case ->
    seconds), with and without MPI's own among the candidates, into the table's "collectives"."""
    sizes, timed = list(mean), list(mean.values())
    own = [{case: seconds for case, seconds in times.items() if case[0] != NATIVE} for times in timed]
    found = {"rules": size_rules(sizes, smoothed(timed)), "without_native": size_rules(sizes, smoothed(own)),
             "measured": [{"bytes": nbytes, "algorithm": alg, "segment": seg, "seconds": seconds}
                          for nbytes, times in mean.items() for (alg, seg), seconds in times.items()]}
    for kind in ("rules", "without_native"):
        print(f"\n{name} on {counted(nranks, 'rank')}, {kind}: which algorithm wins from which size")
        print(f"{'from':>10} {'to':>10}  {'algorithm':<19} segment")
        for rule in found[kind]:
            low, high = rule["bytes"]
            print(f"{low:>10} {high:>10}  {rule['algorithm']:<19} "
                  f"{format_size(rule['segment']) if rule['segment'] else 'unsplit'}")
    data = read_table(args.output)
    data.setdefault("collectives", {}).setdefault(name, {})[str(nranks)] = found
    write_table_file(args.output, data, args.note)
    print(f"\nwrote {args.output}; `auto` takes its {name} rules with RINGTREE_TUNING_FILE={args.output} "
          f"(past {format_size(sizes[-1])}, the last rule's choice)")


def _keep_in_cache(who: dict, mean: dict[int, dict[tuple[str, int], float]]) -> None:
    """The fastest case at each size, native MPI among them, into the tuning cache, as online tuning
    would have committed it for a blocking out-of-place float32 call: a later job on these hosts and
    ranks starts from them."""
    path = cache.path_for(settings.current().cache_dir, who)
    choices = {key_of(nbytes, False, 4, True): Option(*min(timed, key=timed.get)) for nbytes, timed in mean.items()}
    try:
        cache.write(path, who, choices)
    except OSError as error:
        print(f"could not write the tuning cache {path}: {error.strerror}")
        return
    print(f"kept the fastest at each size, native MPI among them, in the tuning cache {path}")


def _existing_table(comm, path: str, layout: dict | None) -> dict:
    """The table at `path` (an empty one where there is none), read on rank 0 and sent to all (with
    --merge the cases every rank times follow from it); UsageError on every rank where the file is not
    a tuning table, which tune does not overwrite, or, to merge into (`layout` given), has no rules and
    segment sizes for this layout."""
    nranks, table, error = comm.Get_size(), None, None
    if comm.Get_rank() == 0:
        try:
            table = read_table(path)
        except NotATable as failure:
            error = f"argument -o/--output: {failure}; not overwriting it: name another file"
        except OSError as failure:
            error = f"argument -o/--output: cannot read {path}: {failure.strerror}"
        else:
            if layout is not None and (str(nranks) not in table["segments"] or not any(
                    layout_key(rule) == layout_key(layout) for rule in table["rules"])):
                error = (f"--merge: {path} has no rules and segment sizes for {counted(nranks, 'rank')} on this "
                         "layout to merge into; tune the whole grid first")
    table, error = comm.bcast((table, error))
    if error:
        raise UsageError(error)
    return table
