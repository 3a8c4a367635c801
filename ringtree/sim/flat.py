"""Schedules in the compact form the simulation runs: flat lists per rank, built in parallel at many ranks."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

from ..algorithms.lower import Shape, lower
from ..schedule import OpKind, Ref, dataflow, stepwise
from ..schedule.ir import ALLREDUCE, Collective

__all__ = ["FlatSchedule", "flat_schedule", "flat_schedules", "partners", "progress_bar", "without_gc",
           "PARALLEL_FROM_RANKS"]

# Below this many ranks the schedules are built in this process; above, by one worker per core.
PARALLEL_FROM_RANKS = 128
# Seconds between a progress bar's states where stderr is no terminal (a log): the first one too.
PROGRESS_EVERY = 10.0


class FlatSchedule(NamedTuple):
    """One rank's schedule as the simulation runs it: per op, in schedule order."""

    kinds: bytes  # OpKind values
    peers: list  # int, or None for a reduction or copy
    sizes: list[int]  # bytes
    dependents: tuple[tuple[int, ...], ...]
    channel_next: tuple[int, ...]
    initial_pending: tuple[int, ...]
    channels: dict[tuple[int, int], list[int]]  # (SEND or RECV, peer) -> its messages' indices, in order
    regions: list[Ref] | None  # the region each op sends, receives into or writes, where asked for


def flat_schedule(shape: Shape, itemsize: int = 4, with_regions: bool = False) -> FlatSchedule:
    """The schedule of `shape` (through lower(), as the engine runs it), flattened. With
    shape.stepwise, each op also waits for the step before, as on the stepwise path."""
    program = lower(shape)
    schedule = stepwise(program.schedule) if program.steps is not None else program.schedule
    flow = dataflow(schedule)
    ops = schedule.ops
    channels: dict[tuple[int, int], list[int]] = {}
    for i, op in enumerate(ops):
        if op.peer is not None:
            channels.setdefault((int(op.kind), op.peer), []).append(i)
    return FlatSchedule(bytes(op.kind for op in ops), [op.peer for op in ops],
                        [op.regions[0].count * itemsize for op in ops], flow.dependents, flow.channel_next,
                        flow.initial_pending, channels,
                        [op.src if op.kind is OpKind.SEND else op.dst for op in ops] if with_regions else None)


def _flat_job(job: tuple) -> FlatSchedule:
    return flat_schedule(*job)


def flat_schedules(algorithm: str, nranks: int, count: int, segment: int = 0, window: int = 4,
                   itemsize: int = 4, regions: bool = False, ranks: int | None = None,
                   progress: bool = False, stepwise: bool = False,
                   collective: Collective = ALLREDUCE, topology=None) -> list[FlatSchedule]:
    """Each rank's flat schedule (of the first `ranks`, default all; segment in elements). Building
    them is most of the work at many ranks; run_events can run them again with other costs.
    `progress`: a progress bar on stderr, where that is a terminal."""
    jobs = [(Shape(algorithm, nranks, rank, count, segment, window, False, stepwise, collective, topology), itemsize,
             regions)
            for rank in range(ranks or nranks)]
    workers = min(os.cpu_count() or 1, 8)
    # Forked workers inherit the collector switched off.
    with without_gc(), progress_bar(progress, len(jobs), "building schedules", "rank") as bar:
        if len(jobs) < PARALLEL_FROM_RANKS or workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return list(_counted(map(_flat_job, jobs), bar))
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(_counted(pool.map(_flat_job, jobs, chunksize=max(1, len(jobs) // (4 * workers))), bar))


def partners(schedules: list[FlatSchedule], algorithm: str) -> list[list[int]]:
    """A message's other end: the k-th send s->r meets the k-th receive at r from s."""
    partner = [[-1] * len(schedule.kinds) for schedule in schedules]
    for s, schedule in enumerate(schedules):
        for (kind, r), send_indices in schedule.channels.items():
            if kind != OpKind.SEND:
                continue
            receive_indices = schedules[r].channels.get((OpKind.RECV, s), [])
            if len(receive_indices) != len(send_indices):
                raise RuntimeError(f"{algorithm}: rank {s} sends {len(send_indices)} messages to rank {r}, "
                                   f"which receives {len(receive_indices)} from it")
            for j, i in zip(send_indices, receive_indices):
                partner[s][j], partner[r][i] = i, j
    return partner


def progress_bar(shown: bool, total: int, what: str, unit: str):
    """A tqdm progress bar on stderr where `shown`: on a terminal redrawn in place and gone at the end;
    elsewhere (a log, a pipe) its state every PROGRESS_EVERY seconds, the last one kept, so that a
    quicker simulation says nothing there. Where not `shown`, one that shows nothing."""
    from tqdm import tqdm
    terminal = sys.stderr is not None and sys.stderr.isatty()
    return tqdm(total=total, desc=what, unit=unit, disable=not shown, leave=not terminal,
                mininterval=0.1 if terminal else PROGRESS_EVERY, delay=0 if terminal else PROGRESS_EVERY)


def _counted(items, bar):
    for item in items:
        bar.update()
        yield item


@contextlib.contextmanager
def without_gc():
    """Python's cycle collector would walk the millions of live tuples of a large simulation again
    and again, and they hold no cycles: off while building and running."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
