"""A program in the form the engine walks: flat tuples indexed by op, built once per call shape."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from ...algorithms.lower import Program, Shape, lower
from ...schedule import INPUT, OUTPUT, OpKind, Schedule, dataflow

__all__ = ["CompiledSchedule", "EXCHANGE", "compile_program", "compiled"]

EXCHANGE = "exchange"  # a step of the stepwise path that sends and receives at once (MPI_Sendrecv)


@dataclass(frozen=True, slots=True)
class CompiledSchedule:
    """A program as the engine walks it.

    Buffers are numbered: 0 input, 1 output, then the scratch buffers in the
    order the schedule declares them.
    """

    schedule: Schedule
    dependents: tuple[tuple[int, ...], ...]  # ops whose deps include this one
    channel_next: tuple[int, ...]  # next message op on the same (kind, peer), or -1
    initial_pending: tuple[int, ...]  # deps, plus one for an earlier message on the same channel
    first_ready: tuple[int, ...]  # ops with nothing to wait for
    # Per op: (SEND | RECV, peer, buffer, element slice) for messages; (REDUCE, dst, left, right) or
    # (COPY, dst, src) with (buffer, element slice) regions for the rest; None for a copy of the input
    # onto itself when the call is in place.
    actions: tuple[tuple, ...]
    in_place_actions: tuple[tuple | None, ...]
    messages: dict[int, int]  # peer -> how many messages this rank sends it and receives from it
    # For the stepwise path (else None), one entry per step: (EXCHANGE, peer, region, peer, region),
    # (SEND | RECV, peer, region), or (REDUCE | COPY, regions...) as above, where a region is
    # (buffer, element slice or None for all of it).
    steps: tuple[tuple, ...] | None
    in_place_steps: tuple[tuple, ...] | None


def compile_program(program: Program) -> CompiledSchedule:
    schedule = program.schedule
    flow = dataflow(schedule)
    number = {INPUT: 0, OUTPUT: 1, **{name: 2 + k for k, (name, _) in enumerate(schedule.scratch)}}
    sizes = schedule.buffer_sizes()

    def elements(ref):
        return number[ref.buffer], slice(ref.offset, ref.end)

    def region(ref):
        whole = ref.offset == 0 and ref.count == sizes[ref.buffer]
        return number[ref.buffer], None if whole else slice(ref.offset, ref.end)

    actions = []
    for op in schedule.ops:
        if op.peer is not None:
            ref = op.src if op.kind is OpKind.SEND else op.dst
            actions.append((op.kind, op.peer, *elements(ref)))
        else:
            actions.append((op.kind, elements(op.dst), *map(elements, op.srcs)))
    at = schedule.input_at  # where INPUT lies in OUTPUT in place: a copy from there onto itself is dropped
    in_place = [None if op.kind is OpKind.COPY and op.src.buffer == INPUT and op.dst.buffer == OUTPUT
                and at is not None and op.src.offset + at == op.dst.offset else action
                for op, action in zip(schedule.ops, actions)]

    def compiled_steps(inplace):
        found = []
        for step in program.steps:
            ops = [schedule.ops[i] for i in step]
            if len(step) == 2:
                send, recv = ops if ops[0].kind is OpKind.SEND else ops[::-1]
                found.append((EXCHANGE, send.peer, region(send.src), recv.peer, region(recv.dst)))
            elif ops[0].peer is not None:
                found.append((ops[0].kind, ops[0].peer, region(ops[0].regions[0])))
            elif not (inplace and in_place[step[0]] is None):
                found.append((ops[0].kind, region(ops[0].dst), *map(region, ops[0].srcs)))
        return tuple(found)

    stepwise = program.steps is not None
    messages = Counter(op.peer for op in schedule.ops if op.peer is not None)
    return CompiledSchedule(schedule, flow.dependents, flow.channel_next, flow.initial_pending,
                            tuple(i for i, p in enumerate(flow.initial_pending) if p == 0), tuple(actions),
                            tuple(in_place), dict(messages), compiled_steps(False) if stepwise else None,
                            compiled_steps(True) if stepwise else None)


@lru_cache(maxsize=256)
def compiled(shape: Shape) -> CompiledSchedule:
    """The program for `shape`, built once per shape."""
    return compile_program(lower(shape))
