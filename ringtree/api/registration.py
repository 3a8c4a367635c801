"""A program's own algorithm: `ringtree.register_algorithm`, which verifies it, then registers it.

    from ringtree import register_algorithm
    register_algorithm("allreduce", "reverse_ring", reverse_ring_allreduce)   # examples/reverse_ring.py
    ringtree.allreduce(x, algorithm="reverse_ring")

The generator is written as ringtree's own are (docs/design.md, "Adding an algorithm"): (nranks, rank,
count) -> Schedule for an allreduce, (nranks, rank, count, collective) -> Schedule for the others,
through a ScheduleBuilder. Before it is registered, the verifier (sim/verify.py) runs its schedules
for 1 to 16 ranks, at counts from 0 to a few per rank (fewer than the ranks among them), even and
uneven blocks, several roots, and segmented: every rank's output must hold what the collective
promises, sends and receives must pair up, no two unordered ops may race, and the ranks must not
deadlock, as the engine runs them or step by step. A generator that fails any of it is refused with
ValueError naming it, the shape and what is wrong, and the registry is left as it was. Registered,
it is one entry of the registry like ringtree's own: calls name it, `python -m ringtree
bench|draw|simulate|tune --import MODULE` take it, and with `offer_to_auto` `auto` may choose it
(online tuning tries it for an allreduce; `tune` measures it for any collective and a table it
writes may name it).

Registration is per process, and every rank must make the same: register at import, like the rest of
the program's code. A communicator's first call compares the ranks' registrations (with the tuning
table, tuning/selector.identity), and each call's signature holds its algorithm's name and where its
generator is defined (runtime/safety/mismatch.py): a rank that registered otherwise is a MismatchError.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ..algorithms import COLLECTIVES, REGISTRY, SHIPPED, Algorithm, add, remove
from ..algorithms.lower import Shape, lower_entry
from ..schedule.collectives import kind_of
from ..schedule.ir import Collective, even_chunks
from ..schedule.topology import Topology
from ..sim.verify import ScheduleError, verify_schedules
from ..words import counted

__all__ = ["register_algorithm", "unregister_algorithm", "VERIFIED_RANKS"]

VERIFIED_RANKS = range(1, 17)  # the rank counts a program's algorithm is verified at before it is registered
SEGMENT_ELEMENTS = 4  # segmented as well, in segments of this many elements, at the largest count
RESERVED = ("auto", "native", "roundtrip")  # names that mean something else where algorithms are named
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def register_algorithm(collective: str, name: str, generator: Callable, *, offer_to_auto: bool = False,
                       node_aware: bool = False, segment: int | None = None) -> Algorithm:
    """Verify `generator` as `collective`'s algorithm `name` for 1 to 16 ranks, then register it; return its
    registry entry. ValueError, the registry unchanged, for an unknown collective, a name taken or reserved,
    or a generator that fails verification (naming the ranks, count and what is wrong).

    offer_to_auto  `auto` may choose it: online tuning tries it among an allreduce's candidates, and
                   `python -m ringtree tune` measures it among the collective's
    node_aware     the generator takes `topology=` (schedule.topology.Topology) on several nodes (allreduce)
    segment        bytes per pipeline segment where a call names it without one (default 1 MiB)
    """
    entry = _entry(collective, name, generator, offer_to_auto, node_aware, segment)
    for shape in _shapes(collective, name):
        _verify(entry, shape)
    add(collective, entry)
    return entry


def unregister_algorithm(collective: str, name: str) -> None:
    """Take a program's own algorithm out of the registry (for tests): a communicator keeps the plans it
    built of it, so register no other generator under the name in the same process."""
    if name not in REGISTRY.get(collective, {}):
        raise ValueError(f"no {collective} algorithm {name!r} is registered")
    remove(collective, name)


def _entry(collective, name, generator, offer_to_auto, node_aware, segment) -> Algorithm:
    where = f"ringtree.register_algorithm({collective!r}, {name!r})"
    if collective not in COLLECTIVES:
        raise ValueError(f"{where}: unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in RESERVED:
        raise ValueError(f"{where}: an algorithm's name is a word of letters, digits and _, and none of "
                         f"{', '.join(RESERVED)}")
    if name in REGISTRY[collective]:
        taken = ("one of ringtree's own" if name in SHIPPED[collective]
                 else f"registered already, by {REGISTRY[collective][name].origin}")
        raise ValueError(f"{where}: the name is taken: {name!r} is {taken}")
    if not callable(generator):
        raise ValueError(f"{where}: the generator must be a function (nranks, rank, count"
                         f"{', collective' if kind_of(collective).given_collective else ''}) -> Schedule, "
                         f"not {generator!r}")
    if node_aware and not kind_of(collective).node_aware:
        raise ValueError(f"{where}: node_aware is an allreduce's (a topology reaches allreduce generators only)")
    if segment is not None and (isinstance(segment, bool) or not isinstance(segment, int) or segment < 1):
        raise ValueError(f"{where}: segment must be a positive number of bytes, got {segment!r}")
    options = {} if segment is None else {"segment": segment}
    return Algorithm(name, generator, node_aware=bool(node_aware), offered=bool(offer_to_auto), **options)


def _shapes(collective: str, name: str) -> Iterator[Shape]:
    """The shapes a program's algorithm is verified at, on each of VERIFIED_RANKS: counts 0, 1, N±1 and
    4N + 3 (also segmented); a reduce-scatter's and allgather's blocks even and uneven (with empty
    ones), a broadcast's and reduce's first and last root (and the middle one), an alltoall's blocks alike."""
    for nranks in VERIFIED_RANKS:
        counts = sorted({0, 1, max(nranks - 1, 0), nranks + 1, 4 * nranks + 3})
        calls: list[tuple[int, Collective]] = []
        kind = kind_of(collective)
        if kind.matrix:  # blocks alike (a matrix of counts is another generator's concern: tuning/collectives.py)
            calls += [(block * nranks, Collective(collective, (block,) * nranks)) for block in (0, 1, 3)]
        elif kind.blocks:
            calls += [(count, Collective(collective, tuple(size for _, size in even_chunks(count, nranks))))
                      for count in counts]
            uneven = tuple((0, 1, 5, 0, 17, 2, 3)[r % 7] for r in range(nranks))
            calls.append((sum(uneven), Collective(collective, uneven)))
        elif kind.rooted:
            calls += [(count, Collective(collective, (), root)) for root in sorted({0, nranks - 1}) for count in counts]
            calls.append((nranks + 1, Collective(collective, (), nranks // 2)))
        else:
            calls += [(count, Collective()) for count in counts]
        for count, shape in calls:
            yield Shape(name, nranks, 0, count, collective=shape)
        largest, shape = max(calls, key=lambda call: call[0])
        yield Shape(name, nranks, 0, largest, segment=SEGMENT_ELEMENTS, collective=shape)
        if kind.node_aware and nranks > 1:  # what a node-aware generator is given on several nodes
            yield Shape(name, nranks, 0, largest, topology=Topology.placed([nranks - nranks // 2, nranks // 2]))
            if nranks % 2 == 0:
                yield Shape(name, nranks, 0, largest, topology=Topology.placed([nranks // 2] * 2, "round-robin"))


def _verify(entry: Algorithm, shape: Shape) -> None:
    """ValueError naming the algorithm, the shape and what is wrong, unless every rank's schedule of
    `shape` computes its collective without deadlock."""
    if shape.topology is not None and not entry.node_aware:
        return
    try:
        schedules = [lower_entry(entry, shape._replace(rank=rank)).schedule for rank in range(shape.nranks)]
        for rank, schedule in enumerate(schedules):
            made = (schedule.nranks, schedule.rank, schedule.count, schedule.collective)
            if made != (shape.nranks, rank, shape.count, shape.collective):
                raise ScheduleError(
                    f"rank {rank}'s schedule is another call's: {schedule.collective.name} of "
                    f"{counted(schedule.count, 'element')} as rank {schedule.rank} of {schedule.nranks}, blocks "
                    f"{list(schedule.collective.counts)}, root {schedule.collective.root} (give the ScheduleBuilder "
                    "the generator's nranks, rank, count and, but for an allreduce, collective)")
        verify_schedules(schedules, stepwise=not shape.segment)
    except Exception as error:  # whatever the program's generator raised: refused, with it named
        what = str(error) if isinstance(error, ScheduleError) else f"the generator raised {type(error).__name__}: {error}"
        raise ValueError(f"ringtree.register_algorithm: {shape.collective.name} algorithm {entry.name!r} refused: "
                         f"on {_described(shape)}: {what}") from error


def _described(shape: Shape) -> str:
    collective = shape.collective
    text = f"{counted(shape.nranks, 'rank')}, {counted(shape.count, 'element')}"
    if collective.kind.blocks:
        text += f" in blocks {list(collective.counts)}"
    elif collective.kind.rooted:
        text += f", root {collective.root}"
    if shape.segment:
        text += f", in segments of {counted(shape.segment, 'element')}"
    if shape.topology is not None:
        text += f", on {shape.topology}"
    return text
