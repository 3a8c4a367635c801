"""The orders a schedule runs in: by its dependencies (dataflow), or a step at a time (stepwise).

The engine issues every op whose dependencies have finished. A blocking call
of a small schedule may instead run it a step at a time, with blocking MPI
calls (the stepwise path, runtime/engine/stepwise.py): cheaper per message, and
nothing to overlap anyway. Both orders are derived here from the same ops.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .ir import OpKind, Schedule

__all__ = ["Dataflow", "dataflow", "steps", "stepwise"]


def steps(schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """The ops in their listed order, as the steps of the stepwise runner, which blocks on each.

    A send and a receive listed next to each other, neither depending on the
    other, form one step (both in flight together, as MPI_Sendrecv); every
    other op is a step of its own. Every generator lists its ops so that this
    order cannot deadlock; the verifier checks it.
    """
    ops, found, i = schedule.ops, [], 0
    while i < len(ops):
        op = ops[i]
        following = ops[i + 1] if i + 1 < len(ops) else None
        if (following is not None and op.peer is not None and following.peer is not None
                and op.kind is not following.kind and i not in following.deps):
            found.append((i, i + 1))
            i += 2
        else:
            found.append((i,))
            i += 1
    return tuple(found)


def stepwise(schedule: Schedule) -> Schedule:
    """The schedule as the stepwise runner runs it: every op of a step (steps()) also waits for every
    op of the step before, so whatever runs it by its dependencies follows the runner's order."""
    ops, before = list(schedule.ops), ()
    for step in steps(schedule):
        for i in step:
            ops[i] = ops[i]._replace(deps=tuple(sorted(set(ops[i].deps) | set(before))))
        before = step
    return dataclasses.replace(schedule, ops=tuple(ops))


@dataclass(frozen=True, slots=True)
class Dataflow:
    """How one rank's ops release each other, for whatever runs a schedule.

    An op may run once its deps have finished and, for a message, once the
    previous message on its channel (same kind, same peer) has been posted:
    posting in schedule order per channel is what makes matching by order work.
    """

    dependents: tuple[tuple[int, ...], ...]  # ops whose deps include this one
    channel_next: tuple[int, ...]  # the next message on the same channel, or -1
    initial_pending: tuple[int, ...]  # deps, plus one for an earlier message on the same channel


def dataflow(schedule: Schedule) -> Dataflow:
    n = len(schedule.ops)
    dependents: list[list[int]] = [[] for _ in range(n)]
    channel_next = [-1] * n
    pending = [len(op.deps) for op in schedule.ops]
    last_on_channel: dict[tuple[OpKind, int], int] = {}
    for i, op in enumerate(schedule.ops):
        for d in op.deps:
            dependents[d].append(i)
        if op.peer is not None:
            previous = last_on_channel.get((op.kind, op.peer))
            if previous is not None:
                channel_next[previous] = i
                pending[i] += 1
            last_on_channel[(op.kind, op.peer)] = i
    return Dataflow(tuple(map(tuple, dependents)), tuple(channel_next), tuple(pending))
