"""The one back-off of every wait (as mpi4py.futures' Backoff): spin, then yield the core, then sleep
between polls; and, every LOOK_EVERY empty polls, the moment to look for signs of a mismatch."""

from __future__ import annotations

import os
import time

__all__ = ["Backoff", "settled", "wait_until", "backed_off", "LOOK_EVERY", "SPINS_BEFORE_YIELD", "SPINS_BEFORE_SLEEP",
           "SLEEP_SECONDS"]

# Empty polls before yielding the core: long enough not to slow a dedicated core's fast path.
SPINS_BEFORE_YIELD = 20
# Empty polls (a few milliseconds) before sleeping between polls: a rank with nothing to do for that
# long gives its core to the ranks that have work, at the price of at most one sleep of latency.
SPINS_BEFORE_SLEEP = 2000
SLEEP_SECONDS = 50e-6
LOOK_EVERY = 256  # empty polls between looks for another rank's signature (mismatch.Watch.look)


class Backoff:
    """One wait's count of empty polls. `quiet` seconds: for so long from the start, the wait neither
    sleeps nor looks (a wait in MPI's own collective: MPI moves a large message between the ranks of
    a node only as fast as both poll, and a look's probes slow a wait that shares a core with a peer's
    work)."""

    __slots__ = ("idle", "quiet_until")

    def __init__(self, quiet: float = 0.0) -> None:
        self.idle = 0
        self.quiet_until = time.perf_counter() + quiet if quiet else 0.0

    def moved(self) -> None:
        """Something moved: the next empty poll starts the count again."""
        self.idle = 0

    def empty(self) -> bool:
        """After an empty poll: let a process that shares this core run (the peer we wait for, when
        ranks outnumber cores); with a core to itself, this returns at once. Says whether it is time
        to look for a mismatch."""
        idle = self.idle = self.idle + 1
        if idle < SPINS_BEFORE_YIELD:
            return False
        quiet = self.quiet_until and time.perf_counter() < self.quiet_until
        if idle >= SPINS_BEFORE_SLEEP and not quiet:
            time.sleep(SLEEP_SECONDS)
        else:
            os.sched_yield()
        if quiet:
            return False
        self.quiet_until = 0.0
        return idle % LOOK_EVERY == 0


def settled(done, progress=None) -> bool:
    """Whether `done()` comes true within the first polls of a wait, before any back-off (`progress` as
    for wait_until): most waits of a small call end there, and their callers then make nothing a
    longer wait needs."""
    spins = 0
    while not done():
        if progress is not None and progress():
            spins = 0
        else:
            spins += 1
            if spins == SPINS_BEFORE_YIELD:
                return False
    return True


def wait_until(done, progress=None, quiet: float = 0.0, watch=None) -> None:
    """The one loop of every wait outside the engine's: poll until `done()` is true, backing off while
    nothing moves (`quiet` as for Backoff). `progress()`, if given, moves the collectives in flight
    between polls and says whether any moved (in_flight.progress_others). `watch`, if given, makes
    the Watch (watch.py) once idle, whose look() the wait calls when the back-off says (a partial of
    Watch: a small call's wait that ends before idling makes no Watch)."""
    if not settled(done, progress):
        backed_off(done, progress, quiet, watch)


def backed_off(done, progress=None, quiet: float = 0.0, watch=None) -> None:
    """wait_until's wait after settled() said no: from the first back-off on."""
    backoff, looking = Backoff(quiet), None
    backoff.idle = SPINS_BEFORE_YIELD
    while not done():
        if progress is not None and progress():
            backoff.moved()
        elif backoff.empty() and watch is not None:
            if looking is None:
                looking = watch()
            looking.look()
