"""The catalogue of schedule generators: one `Algorithm` entry per generator, in REGISTRY by
collective and name.

Generators are pure: they import no MPI and no array library. An entry also says what the rest of
ringtree may assume of its schedules: whether the generator takes a topology, how far the stepwise
path runs it, its segment size where a call names it without one, and the claims the simulator
rests on (TURNING and PERIOD below), which the schedule tests check.

SHIPPED names the algorithms ringtree ships; a program adds its own with `ringtree.register_algorithm`
(api/registration.py: it verifies them first), which lands here through `add`. REGISTRY and its views
(ALGORITHMS, GENERATORS) are changed in place, never replaced, so every module that imported them
sees a program's algorithms too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..schedule.collectives import kind_of
from .allgather import bruck_allgather, recursive_doubling_allgather, ring_allgather
from .alltoall import bruck_alltoall, pairwise_alltoall
from .broadcast import binomial_broadcast, chain_broadcast, scatter_allgather_broadcast
from .double_tree import double_tree_allreduce
from .hierarchical import hierarchical_allreduce
from .rabenseifner import rabenseifner_allreduce
from .recursive_doubling import recursive_doubling_allreduce
from .reduce import binomial_reduce, rabenseifner_reduce
from .reduce_scatter import pairwise_reduce_scatter, recursive_halving_reduce_scatter, ring_reduce_scatter
from .ring import ring_allreduce, ring_period, ring_turns
from .tree import tree_allreduce

__all__ = ["Algorithm", "REGISTRY", "ALGORITHMS", "GENERATORS", "COLLECTIVES", "SHIPPED", "algorithm_of", "add",
           "remove", "offered", "added"]


@dataclass(frozen=True)
class Algorithm:
    """One schedule generator of a collective, and what ringtree may assume of its schedules."""

    name: str
    generator: Callable  # allreduce's: (nranks, rank, count[, topology]); the others': (..., count, collective)
    node_aware: bool = False  # the generator takes `topology=` (schedule.topology.Topology)
    # Segmented, where several ranks of a node cross at once and so share its link, its receives are
    # posted ahead (schedule/pipeline.py): by rendezvous, one receive at a time on a channel leaves the
    # link idle while its go-ahead waits behind the data queued there (docs/design.md, "Pipelining").
    receives_ahead: bool = False
    # Up to this many bytes a blocking call of its unsplit schedule may run a step at a time
    # (runtime/engine/stepwise.py); trees send to several ranks at once, which a step at a time serialises.
    stepwise_max: int = 256 << 10
    # Bytes per segment where a call names the algorithm without a segment (and, for allreduce, the
    # tuning table has none): pipelining pays once a message is several segments long.
    segment: int = 1 << 20
    # (nranks, count) -> the count C whose rank 0 schedule gives rank r's: every peer p as (p + r) mod
    # nranks, every region of chunk c (schedule.even_chunks) moved to chunk (c + r) mod nranks, and the
    # ops on chunks empty at `count` left out (C is count where none is empty). The simulator then
    # runs every rank's op k at once.
    turning: Callable | None = None
    # (nranks, count) -> a P that divides nranks such that rank r + P's schedule is rank r's with every
    # peer p as (p + P) mod nranks. The simulator then runs P ranks for all.
    period: Callable | None = None
    # Whether `auto` may choose it: every shipped one; a program's own where it registered it with
    # offer_to_auto (online tuning tries it; `python -m ringtree tune` measures it).
    offered: bool = True

    @property
    def origin(self) -> str:
        """Where its generator is defined (module.qualified_name): what ranks compare of a program's own."""
        return f"{getattr(self.generator, '__module__', '?')}.{getattr(self.generator, '__qualname__', '?')}"


def _entries(*algorithms: Algorithm) -> dict[str, Algorithm]:
    return {algorithm.name: algorithm for algorithm in algorithms}


_ALLREDUCE_SEGMENT = 4 << 20
REGISTRY: dict[str, dict[str, Algorithm]] = {
    "allreduce": _entries(
        Algorithm("ring", ring_allreduce, node_aware=True, stepwise_max=2 << 20, segment=_ALLREDUCE_SEGMENT,
                  turning=ring_turns, period=ring_period),
        Algorithm("tree", tree_allreduce, segment=_ALLREDUCE_SEGMENT),
        Algorithm("recursive_doubling", recursive_doubling_allreduce, stepwise_max=2 << 20,
                  segment=_ALLREDUCE_SEGMENT),
        Algorithm("rabenseifner", rabenseifner_allreduce, stepwise_max=2 << 20, segment=_ALLREDUCE_SEGMENT),
        Algorithm("double_tree", double_tree_allreduce, segment=_ALLREDUCE_SEGMENT),
        # on one node, the ring: its claims are the ring's
        Algorithm("hierarchical", hierarchical_allreduce, node_aware=True, receives_ahead=True,
                  segment=_ALLREDUCE_SEGMENT, turning=ring_turns, period=ring_period),
    ),
    "reduce_scatter": _entries(
        Algorithm("ring", ring_reduce_scatter),
        Algorithm("recursive_halving", recursive_halving_reduce_scatter),
        Algorithm("pairwise", pairwise_reduce_scatter),
    ),
    "allgather": _entries(
        Algorithm("ring", ring_allgather),
        Algorithm("recursive_doubling", recursive_doubling_allgather),
        Algorithm("bruck", bruck_allgather),
    ),
    "broadcast": _entries(
        Algorithm("binomial", binomial_broadcast),
        Algorithm("chain", chain_broadcast, segment=256 << 10),  # a chain's depth is the rank count
        Algorithm("scatter_allgather", scatter_allgather_broadcast),
    ),
    "reduce": _entries(
        Algorithm("binomial", binomial_reduce),
        Algorithm("rabenseifner", rabenseifner_reduce),
    ),
    "alltoall": _entries(
        Algorithm("pairwise", pairwise_alltoall),
        Algorithm("bruck", bruck_alltoall),
    ),
}
COLLECTIVES = tuple(REGISTRY)
SHIPPED = {collective: tuple(entries) for collective, entries in REGISTRY.items()}  # the rest: a program's own


def algorithm_of(collective: str, name: str) -> Algorithm:
    """The entry of `name` among `collective`'s algorithms; ValueError naming the known ones."""
    known = REGISTRY.get(collective, {})
    if name not in known:
        of = f"{collective} " if kind_of(collective).named else ""
        raise ValueError(f"unknown {of}algorithm {name!r}; known: {', '.join(sorted(known))}")
    return known[name]


# Views of the registry by name: allreduce's generators, and every collective's generator names.
GENERATORS = {collective: {name: entry.generator for name, entry in entries.items()}
              for collective, entries in REGISTRY.items()}
ALGORITHMS = GENERATORS["allreduce"]


def add(collective: str, algorithm: Algorithm) -> None:
    """Put a program's own algorithm in the registry and its views (checked and verified by
    api/registration.py first)."""
    REGISTRY[collective][algorithm.name] = algorithm
    GENERATORS[collective][algorithm.name] = algorithm.generator


def remove(collective: str, name: str) -> None:
    """Take a program's own algorithm out again (a shipped one stays)."""
    if name in SHIPPED[collective]:
        raise ValueError(f"{name!r} is one of ringtree's own {collective} algorithms; only a program's own go")
    REGISTRY[collective].pop(name, None)
    GENERATORS[collective].pop(name, None)


def offered(collective: str) -> list[str]:
    """The names `auto` may choose among for `collective`, in registry order."""
    return [name for name, entry in REGISTRY[collective].items() if entry.offered]


def added() -> list[tuple[str, Algorithm]]:
    """A program's own algorithms, (collective, entry) in registry order."""
    return [(collective, entry) for collective, entries in REGISTRY.items() for name, entry in entries.items()
            if name not in SHIPPED[collective]]
