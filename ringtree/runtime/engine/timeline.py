"""RINGTREE_TIMELINE=path: a Chrome-trace JSON of every message and computation, per rank.

Open it in Perfetto (ui.perfetto.dev) or chrome://tracing. Recording starts
with the first ringtree collective (`start`, from runtime/session/state.py). Each rank
writes `path` with `{rank}` replaced by its rank (or `.rank<r>` added before
the extension) when the process exits; `python -m ringtree timeline-merge -o
OUT FILES...` puts several ranks into one file. When the variable is unset the
engine checks one module flag per op and records nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import time

from ...schedule import OpKind


class Timeline:
    """This process's recording: whether it is on (the engine reads `active` per op), the file's
    template, the events so far, and when each message in flight was posted."""

    __slots__ = ("active", "template", "events", "posted_at")

    def __init__(self) -> None:
        self.active = False
        self.template: str | None = None
        self.events: list[dict] = []
        self.posted_at: dict[tuple[int, int], float] = {}


TIMELINE = Timeline()
LANES = {str(kind): int(kind) + 1 for kind in OpKind}  # a trace's thread ids: send 1, recv 2, reduce 3, copy 4


def start(template: str) -> None:
    """Record from now on, and write the file for this rank at exit; once per process."""
    if TIMELINE.active:
        return
    TIMELINE.active, TIMELINE.template = True, template
    atexit.register(_write_at_exit)


def now() -> float:
    return time.perf_counter_ns() / 1000.0


def posted(execution, i: int) -> None:
    TIMELINE.posted_at[(id(execution), i)] = now()


def completed(execution, i: int) -> None:
    _record(execution, i, TIMELINE.posted_at.pop((id(execution), i)))


def computed(execution, i: int, start: float) -> None:
    _record(execution, i, start)


def _record(execution, i: int, start: float) -> None:
    schedule = execution.compiled.schedule
    op = schedule.ops[i]
    region = op.src if op.kind is OpKind.SEND else op.dst
    name = f"{op.kind} {region.count} el" + (f" {'to' if op.kind is OpKind.SEND else 'from'} {op.peer}"
                                             if op.peer is not None else "")
    TIMELINE.events.append({
        "name": name, "cat": schedule.algorithm, "ph": "X", "ts": start, "dur": max(now() - start, 0.01),
        "tid": LANES[str(op.kind)],
        "args": {"op": i, "call": execution.seq, "tag": execution.tag, "detail": str(op)},
    })


def path_for(rank: int, template: str) -> str:
    if "{rank}" in template:
        return template.format(rank=rank)
    stem, ext = os.path.splitext(template)
    return f"{stem}.rank{rank}{ext or '.json'}"


def _metadata(rank: int) -> list[dict]:
    events = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}]
    events += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}}
               for lane, tid in LANES.items()]
    return events


def write(rank: int) -> str | None:
    if not TIMELINE.events:
        return None
    path = path_for(rank, TIMELINE.template)
    with open(path, "w") as f:
        json.dump({"traceEvents": _metadata(rank) + [{**e, "pid": rank} for e in TIMELINE.events],
                   "displayTimeUnit": "ms"}, f)
    return path


def _write_at_exit() -> None:
    from mpi4py import MPI
    if MPI.Is_initialized() and not MPI.Is_finalized():
        write(MPI.COMM_WORLD.Get_rank())
