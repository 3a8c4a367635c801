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

With --collective reduce_scatter, allgather, broadcast or reduce it tunes that
collective instead, MPI's own among the candidates of its rules, into the same
file (tune_collectives.py says how).

    mpiexec -n 2 python -m ringtree tune -o tuning.json
    RINGTREE_TUNING_FILE=tuning.json mpiexec -n 2 python my_training.py
    mpiexec -n 2 python -m ringtree tune -b 8M -e 32M --merge -o tuning.json
    mpiexec -n 2 python -m ringtree tune --collective reduce_scatter -b 64K -e 64M -o tuning.json
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from mpi4py import MPI

from .. import settings
from ..algorithms import GENERATORS, REGISTRY
from ..allreduce import allreduce
from ..runtime.state import cache_identity, comm_state
from ..tuning import cache
from ..tuning.model import fit
from ..tuning.online import NATIVE, Option, key_of
from .arguments import (
    UsageError,
    at_least,
    comma_list,
    format_size,
    not_its_algorithms,
    output_path,
    parse_size,
    positive,
    size_list,
    sizes_from_args,
)
from .measure import candidates, exact_inputs, in_pass_order, smoothed, time_in_turns
from .table_file import read_table, write_table_file
from .tune_collectives import SEGMENTS_OF_COLLECTIVES, run_collective

SEGMENTS = (1 << 20, 2 << 20, 4 << 20, 16 << 20)
NATIVE_CASE = (NATIVE, 0)  # timed at every size too, for the tuning cache
NAMES = list(dict.fromkeys(name for algorithms in GENERATORS.values() for name in algorithms))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-b", "--minbytes", type=at_least(1, parse_size), default=parse_size("8"), help="smallest size")
    parser.add_argument("-e", "--maxbytes", type=at_least(1, parse_size), default=parse_size("256M"), help="largest size")
    parser.add_argument("-f", "--stepfactor", type=at_least(2), default=2, help="multiply the size by this at each step")
    parser.add_argument("--collective", choices=list(GENERATORS), default="allreduce",
                        help="the collective to tune (another than allreduce: tune_collectives.py says how)")
    parser.add_argument("--algorithms", type=comma_list(NAMES), default=None,
                        help="comma-separated algorithms to try (default: every one of the collective)")
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
        args.algorithms = list(known)
    unknown = [name for name in args.algorithms if name not in known]
    if unknown:
        raise not_its_algorithms(args.collective, unknown, list(known))
    if args.segments is None:
        args.segments = list(SEGMENTS if args.collective == "allreduce" else SEGMENTS_OF_COLLECTIVES)
    if args.merge and args.collective != "allreduce":
        raise UsageError(f"--merge re-tunes allreduce's rules; --collective {args.collective} tunes its whole grid")


def run(args: argparse.Namespace) -> None:
    comm = MPI.COMM_WORLD
    if args.collective != "allreduce":
        run_collective(args, comm)
        return
    rank, nranks = comm.Get_rank(), comm.Get_size()
    layout = layout_of(comm_state(comm).topology)
    algorithms = args.algorithms
    sizes = sizes_from_args(args)
    table = _table_to_merge(comm, args.output, layout) if args.merge else None
    kept_segments = table["segments"][str(nranks)] if args.merge else None

    def cases(nbytes: int) -> list[tuple[str, int]]:
        if kept_segments is None:
            return candidates(nbytes, algorithms, args.segments)
        return [_case(alg, nbytes, kept_segments) for alg in algorithms]

    progress = None
    if rank == 0:
        from tqdm import tqdm
        progress = tqdm(total=args.passes * sum(len(cases(s)) + 1 for s in sizes), unit="case",
                        desc=f"tune {nranks} ranks")
    # Each pass times the whole grid, the second from the largest size down; a case's time is the
    # mean over passes, so a choice rests on the machine at more than one moment.
    passes: dict[int, list[dict]] = {nbytes: [] for nbytes in sizes}
    for k in range(args.passes):
        for nbytes in in_pass_order(sizes, k):
            passes[nbytes].append(_measure(comm, nbytes, cases(nbytes), args))
            if progress is not None:
                progress.update(len(passes[nbytes][-1]))
    if progress is not None:
        progress.close()
    who = cache_identity(comm, comm_state(comm).topology)
    if rank != 0:
        return

    mean = {nbytes: {case: float(np.mean([p[case] for p in runs])) for case in runs[0]}
            for nbytes, runs in passes.items()}
    if settings.current().tune != "off":
        _keep_in_cache(who, mean)
    measured = [(alg, nranks, nbytes, seg, seconds) for nbytes, timed in mean.items() for (alg, seg), seconds in timed.items()]
    if args.merge:  # the times of the sizes not re-tuned stay, and the model is fitted to all
        measured += [(m["algorithm"], nranks, m["bytes"], m["segment"], m["seconds"])
                     for m in table["measured"].get(measured_key(layout), []) if m["bytes"] not in mean]
    ours = [m for m in measured if m[0] != NATIVE]  # ringtree's own: what the model and segments are fitted to
    params = fit(ours)
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
    print(f"\n{nranks} ranks: which algorithm wins from which size")
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
    print(f"\nthe table rules sizes up to {format_size(covered[-1][1])} on {nranks} ranks; "
          "other sizes go to online tuning (RINGTREE_TUNE=online, the default), else to the fitted model")
    print(f"wrote {args.output}; use it with RINGTREE_TUNING_FILE={args.output}")


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


def _measure(comm, nbytes: int, cases: list[tuple[str, int]], args) -> dict[tuple[str, int], float]:
    """Median seconds per call of each case and of native MPI, the slowest rank's, timed in turns."""
    data, expected = exact_inputs(comm, max(1, nbytes // 4), np.float32)
    out = np.empty_like(data)
    calls = {case: (lambda alg=case[0], seg=case[1]: allreduce(data, out, comm=comm, algorithm=alg,
                                                                segment=seg or 1 << 62))
             for case in cases}
    calls[NATIVE_CASE] = lambda: comm.Allreduce(data, out)
    wrong = []
    for case, call in calls.items():
        call()
        if not np.array_equal(out, expected):
            wrong.append(case)
    wrong = comm.allgather(wrong)
    if any(wrong):
        raise SystemExit(f"tune: results differ from native MPI at {nbytes} B: {wrong}")

    return time_in_turns(comm, calls, args.batch, args.iters, args.budget)


def winners_from(mean: dict[int, dict[tuple[str, int], float]], algorithms: list[str],
                 best_segments: dict[str, int], without_native: list | None = None) -> list[tuple]:
    """(size, algorithm, segment, seconds, and where it is NATIVE the winner of `without_native` at
    that size) for each size of `mean` (size -> (algorithm, segment) -> seconds), ascending: each
    algorithm with its one segment size, unsplit where the message is no larger, the fastest at each
    size, except that a lone size between two of another winner takes theirs where that is within
    BLIP_WITHIN. A crossover stays where it was measured."""
    sizes = sorted(mean)
    time_of = []
    for nbytes in sizes:
        cases = {alg: _case(alg, nbytes, best_segments) for alg in algorithms}
        time_of.append({alg: mean[nbytes][case] for alg, case in cases.items() if case in mean[nbytes]})
    chosen = smoothed(time_of)
    return [(nbytes, *_case(alg, nbytes, best_segments), times[alg],
             without_native[k] if alg == NATIVE else None)
            for k, (nbytes, alg, times) in enumerate(zip(sizes, chosen, time_of))]


def _case(algorithm: str, nbytes: int, segments: dict[str, int]) -> tuple[str, int]:
    """(algorithm, segment) as a call of `nbytes` naming it runs with these segment sizes: unsplit
    where the message is no larger than its segment; MPI's own unsplit always."""
    segment = segments.get(algorithm, REGISTRY["allreduce"][algorithm].segment) if algorithm != NATIVE else 0
    return algorithm, segment if nbytes > segment else 0


def layout_of(topology) -> dict:
    """The fields that limit a rule to the layout `topology` is: its rank count, its nodes and the
    most ranks on one of them."""
    n, nodes, per_node = topology.nranks, topology.nodes, max(topology.ranks_per_node)
    return {"ranks": [n, n], "nodes": [nodes, nodes], "ranks_per_node": [per_node, per_node]}


def measured_key(layout: dict) -> str:
    """Where a table keeps the times a layout's rules rest on: "4" on one node, "4 on 2 nodes of 2"."""
    n, nodes, per_node = layout["ranks"][0], layout["nodes"][0], layout["ranks_per_node"][0]
    return str(n) if nodes == 1 else f"{n} on {nodes} nodes of {per_node}"


def layout_key(rule: dict) -> tuple:
    """Which layout a rule was tuned on; a rule that names none, on one node (as tables were before
    ringtree told nodes apart)."""
    return (tuple(rule["ranks"]), tuple(rule.get("nodes", (1, 1))), tuple(rule.get("ranks_per_node", rule["ranks"])))


def rules_from(winners: list[tuple], layout: dict, previous: int = -1) -> list[dict]:
    """Rules for one layout from the winner at each size (winners_from): runs of one winner become
    one rule, covering the sizes above the previous grid point (the first: above `previous`) up to
    its last grid point; a rule of MPI's own names ringtree's winner for the calls MPI cannot run.
    No rule goes past the largest size measured: a table rules only what it measured."""
    rules: list[dict] = []
    for nbytes, algorithm, segment, _, otherwise in winners:
        rule = {"algorithm": algorithm, "segment": segment}
        if otherwise is not None:
            rule["without_native"] = {"algorithm": otherwise[1], "segment": otherwise[2]}
        if rules and _same(rules[-1], rule):
            rules[-1]["bytes"][1] = nbytes
        else:
            rules.append({**{key: list(value) for key, value in layout.items()}, "bytes": [previous + 1, nbytes],
                          **rule})
        previous = nbytes
    return rules


def _same(rule: dict, other: dict) -> bool:
    """Whether two neighbouring rules choose alike, so that they can be one."""
    return all(rule.get(key) == other.get(key) for key in ("algorithm", "segment", "without_native"))


def merged_rules(old: list[dict], new: list[dict], low: int, high: int) -> list[dict]:
    """One rank count's rules: `old` for sizes up to `low` and above `high`, `new` (which covers the
    sizes between) in between; neighbours with the same algorithm and segment become one rule."""
    def upper(rule):
        return float("inf") if rule["bytes"][1] is None else rule["bytes"][1]

    below = [{**rule, "bytes": [rule["bytes"][0], min(upper(rule), low)]} for rule in old if rule["bytes"][0] <= low]
    above = [{**rule, "bytes": [max(rule["bytes"][0], high + 1), rule["bytes"][1]]} for rule in old
             if upper(rule) > high]
    rules: list[dict] = []
    for rule in below + new + above:
        if rules and _same(rules[-1], rule):
            rules[-1]["bytes"][1] = rule["bytes"][1]
        else:
            rules.append({**rule, "bytes": list(rule["bytes"])})
    return rules


def segments_from(measurements) -> dict[str, int]:
    """Per algorithm, the segment size that did best over the sizes where every segment was tried
    (by the geometric mean of its time over the best time at each size)."""
    times: dict[str, dict[int, dict[int, float]]] = {}
    for algorithm, _, nbytes, segment, seconds in measurements:
        times.setdefault(algorithm, {}).setdefault(nbytes, {})[segment] = seconds
    chosen = {}
    for algorithm, by_size in times.items():
        segments = {segment for by_segment in by_size.values() for segment in by_segment if segment}
        full = [{s: by_segment[s] for s in segments} for by_segment in by_size.values()
                if segments <= by_segment.keys()]
        if segments and full:
            score = {segment: sum(math.log(t[segment] / min(t.values())) for t in full) for segment in segments}
            chosen[algorithm] = min(sorted(score), key=score.get)
    return chosen


def write_table(path: str, layout: dict, rules: list[dict], params, best_segments: dict[str, int], note: str,
                measurements) -> None:
    """Write the rules and every case's time (`measurements`: (algorithm, nranks, bytes, segment,
    seconds)) for `layout` into the table at `path`, keeping other layouts'; on one node also the
    model and segment sizes of its rank count (those the selector reads on one node only)."""
    data = read_table(path)
    nranks = layout["ranks"][0]
    kept = [rule for rule in data["rules"] if layout_key(rule) != layout_key(layout)]
    # A rule for any layout comes after those for one, within a rank count: the first match wins.
    data["rules"] = sorted(kept + rules, key=lambda rule: (rule["ranks"][0], "nodes" not in rule))
    if layout["nodes"] == [1, 1]:
        data["models"][str(nranks)] = params._asdict()
        data["segments"][str(nranks)] = best_segments
    data["measured"][measured_key(layout)] = [{"bytes": b, "algorithm": a, "segment": s, "seconds": t}
                                     for a, _, b, s, t in measurements]
    write_table_file(path, data, note)


def _table_to_merge(comm, path: str, layout: dict) -> dict:
    """The table at `path`, read on rank 0 and sent to all (the cases every rank times follow from
    it); SystemExit on every rank where it has no rules and segment sizes for this rank count."""
    nranks, table, error = comm.Get_size(), None, None
    if comm.Get_rank() == 0:
        try:
            table = read_table(path)
        except (OSError, ValueError, SystemExit) as failure:
            error = f"tune --merge: {failure}"
        else:
            if (str(nranks) not in table["segments"]
                    or not any(layout_key(rule) == layout_key(layout) for rule in table["rules"])):
                error = (f"tune --merge: {path} has no rules and segment sizes for {nranks} ranks on this layout "
                         "to merge into; tune the whole grid first")
    table, error = comm.bcast((table, error))
    if error:
        raise SystemExit(error)
    return table
