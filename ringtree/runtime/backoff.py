"""The back-off every idle wait shares: spin, then yield the core, then sleep between polls."""

from __future__ import annotations

import os
import time

__all__ = ["back_off", "SPINS_BEFORE_YIELD", "SPINS_BEFORE_SLEEP", "SLEEP_SECONDS"]


def back_off(idle: int) -> None:
    """After `idle` empty polls in a row, let a process that shares this core run (the peer we wait
    for, when ranks outnumber cores); with a core to itself, this returns at once."""
    if idle >= SPINS_BEFORE_SLEEP:
        time.sleep(SLEEP_SECONDS)
    elif idle >= SPINS_BEFORE_YIELD:
        os.sched_yield()


# Empty polls before yielding the core: long enough not to slow a dedicated core's fast path.
SPINS_BEFORE_YIELD = 20
# Empty polls (a few milliseconds) before sleeping between polls: a rank with nothing to do for that
# long gives its core to the ranks that have work, at the price of at most one sleep of latency.
SPINS_BEFORE_SLEEP = 2000
SLEEP_SECONDS = 50e-6
