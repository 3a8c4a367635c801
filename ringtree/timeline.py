"""RINGTREE_TIMELINE=path: a Chrome-trace JSON of every message and computation, per rank.

Open it in Perfetto (ui.perfetto.dev) or chrome://tracing. Each rank writes
`path` with `{rank}` replaced by its rank (or `.rank<r>` added before the
extension) when the process exits; `python -m ringtree timeline-merge OUT
FILES...` puts several ranks into one file. When the variable is unset the
engine checks one module flag per op and records nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import time

ACTIVE = bool(os.environ.get("RINGTREE_TIMELINE"))
_events: list[dict] = []
_posted_at: dict[tuple[int, int], float] = {}
_LANES = {"send": 1, "recv": 2, "reduce": 3, "copy": 4}


def now() -> float:
    return time.perf_counter_ns() / 1000.0


def posted(execution, i: int) -> None:
    _posted_at[(id(execution), i)] = now()


def completed(execution, i: int) -> None:
    _record(execution, i, _posted_at.pop((id(execution), i)))


def computed(execution, i: int, start: float) -> None:
    _record(execution, i, start)


def _record(execution, i: int, start: float) -> None:
    op = execution.plan.schedule.ops[i]
    schedule = execution.plan.schedule
    region = op.src if op.kind.value == "send" else op.dst
    name = f"{op.kind.value} {region.count} el" + (f" {'to' if op.kind.value == 'send' else 'from'} {op.peer}"
                                                    if op.peer is not None else "")
    _events.append({
        "name": name, "cat": schedule.algorithm, "ph": "X", "ts": start, "dur": max(now() - start, 0.01),
        "tid": _LANES[op.kind.value],
        "args": {"op": i, "tag": execution.tag, "detail": str(op)},
    })


def path_for(rank: int, template: str) -> str:
    if "{rank}" in template:
        return template.format(rank=rank)
    stem, ext = os.path.splitext(template)
    return f"{stem}.rank{rank}{ext or '.json'}"


def _metadata(rank: int) -> list[dict]:
    events = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}]
    events += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}}
               for lane, tid in _LANES.items()]
    return events


def write(rank: int) -> str | None:
    if not _events:
        return None
    path = path_for(rank, os.environ["RINGTREE_TIMELINE"])
    with open(path, "w") as f:
        json.dump({"traceEvents": _metadata(rank) + [{**e, "pid": rank} for e in _events],
                   "displayTimeUnit": "ms"}, f)
    return path


def merge(out: str, paths: list[str]) -> None:
    events = []
    for p in paths:
        with open(p) as f:
            events += json.load(f)["traceEvents"]
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


if ACTIVE:
    def _write_at_exit() -> None:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            write(MPI.COMM_WORLD.Get_rank())

    atexit.register(_write_at_exit)
