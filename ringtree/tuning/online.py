"""Online tuning: the first calls of each key try the candidates, then every rank commits to the fastest.

A key is what changes the winner: the message's size class (sizes from 2^(k-1)
to 2^k - 1 bytes are class k), whether the call is in place, the element size,
and whether the MPI library's own allreduce ("native") may run the call. The
calls of a key take the candidates one after another, trials(key) calls in a
row each; each rank keeps the time of every call. At the key's next call the
ranks combine those times into the slowest rank's per call (one small
allreduce), and commit to the candidate whose median call was fastest. The
slowest rank's time per call, not each rank's own: in calls in a row the ranks
take turns at arriving late, and the late one's call is short, so each rank's
times alone are shorter than any call took on all of them. The median, not the
best: a candidate whose calls vary is as fast as its typical call, not its
luckiest, and the first call, which builds the candidate's plan, does not
count. Every rank makes the same calls in the same order, so every rank tries
the same candidate at the same call and commits the same choice, whatever its
own clock said.

Pure: the engine's work (waiting for trials in flight, combining the times
over ranks) comes in as functions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import NamedTuple

from ..algorithms import SHIPPED, offered
from ..debug import log
from .model import Params, predict

__all__ = ["NATIVE", "TRIALS", "TRIALS_SMALL", "Key", "trials", "Option", "Tuner", "key_of", "options_for"]

NATIVE = "native"  # the MPI library's own Allreduce
HIERARCHICAL = "hierarchical"
# Timed calls per candidate (the first also builds the candidate's plan, which the median leaves
# out): more below 1 MiB, where a call is short and one call's time noisy.
TRIALS = 3
TRIALS_SMALL = 7
SMALL_CLASS = 20  # size classes up to this one (messages under 1 MiB) take TRIALS_SMALL
# Candidates the cost model predicts slower than this times its best are not tried.
PRUNE_WITHIN = 3.0
MAX_SCHEDULES = 8  # algorithm and segment pairs tried per key on one node, native aside
# Segment sizes tried, beside unsplit, for messages larger than them; on several nodes also smaller
# ones, which pipeline messages through the nodes' links (docs/performance.md, across hosts).
SEGMENTS = (1 << 20, 4 << 20)
SEGMENTS_ACROSS_NODES = (256 << 10, 1 << 20, 4 << 20)
UNSPLIT_MAX_BYTES = 16 << 20  # above this, unsplit needs scratch the size of the message: segments only


class Key(NamedTuple):
    size_class: int  # nbytes.bit_length()
    in_place: bool
    itemsize: int
    native: bool  # native is a candidate: a blocking call, no timeout, a dtype and op MPI reduces

    def __str__(self) -> str:
        low = 1 << (self.size_class - 1) if self.size_class else 0
        return (f"{low}-{(1 << self.size_class) - 1} B, {'in place' if self.in_place else 'out of place'}, "
                f"{self.itemsize}-byte elements{', native allowed' if self.native else ''}")


class Option(NamedTuple):
    algorithm: str  # a name from ALGORITHMS (ringtree.algorithms), or NATIVE
    segment: int  # bytes; 0: unsplit

    def __str__(self) -> str:
        return self.algorithm + (f" segment {self.segment >> 10} KiB" if self.segment else "")


def trials(key: Key) -> int:
    return TRIALS_SMALL if key.size_class <= SMALL_CLASS else TRIALS


def key_of(nbytes: int, in_place: bool, itemsize: int, native: bool) -> Key:
    return Key(nbytes.bit_length(), in_place, itemsize, native)


def options_for(key: Key, nranks: int, params: Params, nodes: int = 1) -> list[Option]:
    """The candidates of a key, in an order every rank computes alike; then native, where allowed.
    On one node: the algorithms the model does not rule out, fastest predicted first, each unsplit
    and with each segment size smaller than the message, at most MAX_SCHEDULES (the hierarchical
    allreduce left out: there it is a ring's two halves). On several nodes, where the model, which
    does not tell nodes apart, rules nothing out: the hierarchical allreduce in each segment size,
    then every other algorithm in the first (which crossing edges a layout gives each decides). A program's
    own algorithms offered to auto (ringtree.register_algorithm), which the model knows nothing of, follow,
    each as ringtree's own are tried, and are never pruned."""
    nbytes = (1 << key.size_class) - 1  # the class's largest message
    segments = SEGMENTS_ACROSS_NODES if nodes > 1 else SEGMENTS
    splits = ([0] if nbytes <= UNSPLIT_MAX_BYTES else []) + [s for s in segments if s < nbytes]
    names = [name for name in SHIPPED["allreduce"] if name != HIERARCHICAL]
    own = [name for name in offered("allreduce") if name not in SHIPPED["allreduce"]]
    predicted = {name: predict(name, nranks, nbytes, params) for name in names}
    if nodes > 1:
        first = next((segment for segment in splits if segment), 0)  # pipelined through the links where it can be
        others = sorted(names, key=predicted.get)
        options = [Option(HIERARCHICAL, segment) for segment in splits] + [Option(name, first) for name in others]
        options += [Option(name, first) for name in own]
    else:
        # Unsplit: the model counts a segment's messages but not the overlap it buys, so it would rule
        # out every split; an algorithm's unsplit time stands for its splits.
        best = min(predicted.values())
        kept = sorted((name for name in names if predicted[name] <= PRUNE_WITHIN * best), key=predicted.get)
        options = [Option(name, segment) for name in kept for segment in splits][:MAX_SCHEDULES]
        options += [Option(name, segment) for name in own for segment in splits]
    return options + ([Option(NATIVE, 0)] if key.native else [])


class _Exploration:
    def __init__(self, options: list[Option]) -> None:
        self.options = options
        self.started = 0
        self.times: list[list[float]] = [[] for _ in options]  # this rank's seconds of each call, per option
        self.waiting: list[Callable[[], None]] = []  # trials in flight: wait for each before deciding


class Tuner:
    """The choice for each key on one communicator: committed ones (learned, or from the cache), and
    the explorations under way. `explore=False` only uses what is committed."""

    def __init__(self, nranks: int, params: Params, committed: dict[Key, Option], explore: bool,
                 on_commit: Callable[[Key, Option], None], nodes: int = 1) -> None:
        self.nranks, self.nodes = nranks, nodes
        self.params = params
        self.committed = dict(committed)
        self.cached = set(committed)  # the keys whose choice came from the cache
        self.explore = explore
        self.on_commit = on_commit
        self.explorations: dict[Key, _Exploration] = {}

    def choose(self, key: Key, combine: Callable[[list[float]], list[float]]) -> tuple[Option, str, object] | None:
        """The option for a call of `key`, why it was chosen, and the trial to record its time in
        (None when it is not a trial); None when nothing is committed and this tuner does not explore.
        `combine` maps this rank's times to the slowest rank's."""
        option = self.committed.get(key)
        if option is not None:
            return option, "the tuning cache" if key in self.cached else "online tuning", None
        if not self.explore:
            return None
        exploration = self.explorations.get(key)
        if exploration is None:
            exploration = self.explorations[key] = _Exploration(options_for(key, self.nranks, self.params, self.nodes))
            # Logged now and at the commitment, not at each trial: rank 0's logging would be in the times.
            log.info("tune %s: trials of %d calls each, in a row: %s", key, trials(key),
                     ", ".join(map(str, exploration.options)))
        total = trials(key) * len(exploration.options)
        if exploration.started < total:
            index = exploration.started // trials(key)  # calls in a row: what a committed choice runs
            exploration.started += 1
            return exploration.options[index], "a trial", (exploration, index)
        for wait in exploration.waiting:
            wait()
        flat = combine([seconds for times in exploration.times for seconds in times])  # every rank made as many
        slowest, at = [], 0
        for times in exploration.times:
            slowest.append(statistics.median(flat[at:at + len(times)]) if times else math.inf)
            at += len(times)
        index = min(range(len(slowest)), key=lambda i: (slowest[i], i))
        option = self.committed[key] = exploration.options[index]
        del self.explorations[key]
        log.info("tune %s: committed to %s; the trials' times (the median of %d calls, each the slowest rank's): %s", key,
                 option, trials(key),
                 ", ".join(f"{o} {s * 1e6:.1f} us" for o, s in zip(exploration.options, slowest)))
        self.on_commit(key, option)
        return option, "online tuning", None

    @staticmethod
    def record(trial, seconds: float) -> None:
        exploration, index = trial
        exploration.times[index].append(seconds)

    @staticmethod
    def in_flight(trial, wait: Callable[[], None]) -> None:
        """A nonblocking trial: the decision waits for it (its time is recorded when it finishes)."""
        trial[0].waiting.append(wait)
