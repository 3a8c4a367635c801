"""The tuning table file as `tune` writes it: rules from the times it measured, read (an empty table
where there is none) and written back, whatever else it holds kept."""

from __future__ import annotations

import json
import math
import os

from ..algorithms import REGISTRY
from ..tuning.online import NATIVE
from ..tuning.selector import FORMAT
from .measure import smoothed

__all__ = ["NotATable", "read_table", "write_table_file", "winners_from", "layout_of", "measured_key", "layout_key", "rules_from",
           "merged_rules", "segments_from", "write_table", "size_rules", "case_of"]


class NotATable(ValueError):
    """A file that is not a tuning table: tune does not overwrite it."""


def read_table(path: str) -> dict:
    """The table at `path`, or an empty one where there is none; NotATable (saying what the file is)
    where the file is not a tuning table, OSError where it cannot be read."""
    data = {"format": FORMAT, "note": "", "rules": [], "models": {}, "segments": {}, "measured": {}}
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
        try:
            found = json.loads(text)
        except ValueError:
            raise NotATable(f"{path} is not a ringtree tuning table (not JSON)") from None
        if not isinstance(found, dict) or found.get("format") != FORMAT:
            what = ("a JSON object with no \"format\"" if isinstance(found, dict) and "format" not in found else
                    f"format {found['format']!r}, not {FORMAT!r}" if isinstance(found, dict) else "JSON, not an object")
            raise NotATable(f"{path} is not a ringtree tuning table ({what})")
        data.update(found)
    return data


def write_table_file(path: str, data: dict, note: str) -> None:
    """`data` into the file at `path`, with `note` (where it was measured) if given."""
    if note:
        data["note"] = note
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


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
        cases = {alg: case_of(alg, nbytes, best_segments) for alg in algorithms}
        time_of.append({alg: mean[nbytes][case] for alg, case in cases.items() if case in mean[nbytes]})
    chosen = smoothed(time_of)
    return [(nbytes, *case_of(alg, nbytes, best_segments), times[alg],
             without_native[k] if alg == NATIVE else None)
            for k, (nbytes, alg, times) in enumerate(zip(sizes, chosen, time_of))]


def case_of(algorithm: str, nbytes: int, segments: dict[str, int]) -> tuple[str, int]:
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


def size_rules(sizes: list[int], winners: list[tuple[str, int]]) -> list[dict]:
    """A collective's rules by size alone (the tables of the collectives other than allreduce) from the
    (algorithm, segment) winning at each size of `sizes` (ascending): a run of one winner is one rule,
    from above the grid point before it (the first: from 0) to its last."""
    rules: list[dict] = []
    previous = -1
    for nbytes, (algorithm, segment) in zip(sizes, winners):
        if rules and (rules[-1]["algorithm"], rules[-1]["segment"]) == (algorithm, segment):
            rules[-1]["bytes"][1] = nbytes
        else:
            rules.append({"bytes": [previous + 1, nbytes], "algorithm": algorithm, "segment": segment})
        previous = nbytes
    return rules
