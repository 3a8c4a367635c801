"""The stepwise path: a blocking call of a small schedule, run a step at a time with blocking MPI.

Each step is a Sendrecv, a Send, a Recv, a reduction or a copy, in the
schedule's listed order (schedule.order.steps). That costs less per message
than the engine's nonblocking calls and polling, and an algorithm that
exchanges with one partner at a time leaves the engine nothing to overlap.
It progresses nothing else, so it runs only when no other collective is in
flight in this process (tuning/selector.py says up to which sizes).
"""

from __future__ import annotations

from mpi4py import MPI

from ..schedule import OpKind
from .compiled import EXCHANGE
from .failures import error_classes, translated, wrong_size

__all__ = ["bound_steps", "run_stepwise"]

BYTE = MPI.BYTE
SEND, RECV, REDUCE, COPY = OpKind.SEND, OpKind.RECV, OpKind.REDUCE, OpKind.COPY


def bound_steps(steps: tuple[tuple, ...], buffers: list) -> tuple[tuple, ...]:
    """Compiled steps (CompiledSchedule.steps) bound to a call's buffers: each region made an array
    (a message's as [region, MPI.BYTE]), once, so that a call repeated on the same arrays reuses them.
    First the MPI.Status its receives fill, then (EXCHANGE, send, to, receive, from, receive bytes),
    (SEND, message, to), (RECV, message, from, bytes), (REDUCE, left, right, out), (COPY, to, from)."""
    def region(buffer, elements):
        return buffers[buffer] if elements is None else buffers[buffer][elements]

    bound: list = [MPI.Status()]  # first: the status its receives fill, its own, as threads may run others at once
    for step in steps:
        kind = step[0]
        if kind is EXCHANGE:
            _, to, send, source, receive = step
            into = region(*receive)
            bound.append((EXCHANGE, [region(*send), BYTE], to, [into, BYTE], source, into.nbytes))
        elif kind is REDUCE:
            _, out, left, right = step
            bound.append((REDUCE, region(*left), region(*right), region(*out)))
        elif kind is COPY:
            bound.append((COPY, region(*step[1]), region(*step[2])))
        else:
            message = region(*step[2])
            bound.append((kind, [message, BYTE], step[1]) if kind is SEND
                         else (kind, [message, BYTE], step[1], message.nbytes))
    return tuple(bound)


def run_stepwise(steps: tuple[tuple, ...], reduce, copy, comm: MPI.Comm, tag: int) -> None:
    """Run bound steps (`bound_steps`) to the end. Messages go as bytes; a message of another size
    than its receive raises MismatchError."""
    status = steps[0]
    try:
        for step in steps[1:]:
            kind = step[0]
            if kind is EXCHANGE:
                _, send, to, receive, source, nbytes = step
                comm.Sendrecv(send, to, tag, receive, source, tag, status)
                if status.Get_count(BYTE) != nbytes:
                    raise wrong_size(comm, source, status.Get_count(BYTE), nbytes)
            elif kind is REDUCE:
                _, left, right, out = step
                reduce(left, right, out)
            elif kind is COPY:
                copy(step[1], step[2])
            elif kind is SEND:
                comm.Send(step[1], step[2], tag)
            else:
                _, message, source, nbytes = step
                comm.Recv(message, source, tag, status)
                if status.Get_count(BYTE) != nbytes:
                    raise wrong_size(comm, source, status.Get_count(BYTE), nbytes)
    except MPI.Exception as error:
        peer = step[4] if step[0] is EXCHANGE else step[2]  # an exchange names the rank it receives from
        ours = translated(error_classes(error, [status]), comm, True, peer)
        if ours is None:
            raise
        raise ours from None
