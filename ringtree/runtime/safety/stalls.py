"""Stalls are never silent: a rank that waits in a collective with no progress for
RINGTREE_STALL_WARNING seconds (60 by default) logs a warning, and again after each such interval.

WATCHDOG.first says what the first thread to call ringtree waits in: [what, progress];
every other thread has a list of its own (`slot()`). A wait sets `what` (an
Execution, a `Call`, anything with a `call` attribute giving one, or a
description of its own) and clears it when done; every call and every message
the engine completes in that thread's wait bumps `progress`. A watchdog thread, started with the first communicator, samples it
every quarter interval (at most every second): the same wait with the same
progress for an interval is a stall. The thread calls no MPI; it reads what the
waiting thread left there.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

from ...debug import log
from ...words import counted
from .threads import THREADS, get_ident

__all__ = ["WATCHDOG", "Call", "slot", "watch", "watched"]


class Watchdog:
    """What each thread waits in, [what, progress]: the first calling thread's (`first`) and the
    others' by ident; the watchdog thread once started."""

    __slots__ = ("first", "others", "thread", "starting")

    def __init__(self) -> None:
        self.first: list = [None, 0]
        self.others: dict[int, list] = {}
        self.thread: threading.Thread | None = None
        self.starting = threading.Lock()


WATCHDOG = Watchdog()


def slot() -> list:
    """The calling thread's [what, progress]: WATCHDOG.first for the first thread that called ringtree."""
    ident = get_ident()
    if THREADS.first is None or ident == THREADS.first:
        return WATCHDOG.first
    others = WATCHDOG.others
    mine = others.get(ident)
    if mine is None:
        mine = others[ident] = [None, 0]
    return mine


def watched(run, what):
    """run(), with the watchdog told that the calling thread waits in `what` meanwhile."""
    waiting = slot()
    waiting[0] = what
    try:
        return run()
    finally:
        waiting[0] = None
        waiting[1] += 1


class Call(NamedTuple):
    """A collective as the warning describes it."""

    state: object  # the communicator's CommState
    count: int
    dtype: object
    op: str
    algorithm: str
    peers: tuple[int, ...]  # the ranks it exchanges with; () when not known (MPI's own allreduce)


def watch(interval: float | None) -> None:
    """Start the watchdog, once per process (no interval: stall warnings off)."""
    with WATCHDOG.starting:
        if interval is None or WATCHDOG.thread is not None:
            return
        WATCHDOG.thread = threading.Thread(target=_watch, args=(interval,), name="ringtree stall watchdog",
                                           daemon=True)
        WATCHDOG.thread.start()


def _watch(interval: float) -> None:
    watched: dict = {}  # thread -> (what, progress) last seen, since when, warnings given
    while True:
        time.sleep(min(1.0, interval / 4))
        for thread, waiting in [(None, WATCHDOG.first), *list(WATCHDOG.others.items())]:
            now = (waiting[0], waiting[1])
            seen, since, warned = watched.get(thread, ((None, 0), 0.0, 0))
            if now[0] is None or now[0] is not seen[0] or now[1] != seen[1]:
                watched[thread] = (now, time.monotonic(), 0)
                continue
            stalled = time.monotonic() - since
            if stalled >= (warned + 1) * interval:
                watched[thread] = (seen, since, warned + 1)
                log.warning("%s", _describe(now[0], stalled))


def _describe(what, seconds: float) -> str:
    """The warning for a wait in `what` with no progress for `seconds`."""
    if isinstance(what, str):
        return f"ringtree: {what}: no progress for {seconds:.0f} s (still waiting)"
    collective = "allreduce"
    if hasattr(what, "peers_waited_for"):  # the engine's Execution: its messages in flight say whom it waits for
        schedule, state = what.compiled.schedule, what.state
        call = f"#{what.seq} ({schedule.algorithm}, {counted(schedule.count, 'element')})"
        peers, collective = what.peers_waited_for(), schedule.collective.name
    else:
        what = getattr(what, "call", what)
        state, peers = what.state, list(what.peers)
        call = f"({counted(what.count, 'element')} of {what.dtype.name}, {what.op}, algorithm {what.algorithm})"
    if peers:
        waits_for = "; it waits for " + ("rank " if len(peers) == 1 else "ranks ") + ", ".join(map(str, peers))
    else:
        waits_for = "; it waits in the MPI library's own allreduce, for any rank"
    return (f"ringtree {collective} {call} on rank {state.rank} of {state.name}: no progress for "
            f"{seconds:.0f} s{waits_for} (still waiting; RINGTREE_TIMEOUT or timeout= makes this an error)")
