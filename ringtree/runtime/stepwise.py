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

__all__ = ["run_stepwise"]

BYTE = MPI.BYTE
SEND, RECV, REDUCE, COPY = OpKind.SEND, OpKind.RECV, OpKind.REDUCE, OpKind.COPY
_STATUS = MPI.Status()  # reused: ringtree is called from one thread at a time (docs/design.md)


def run_stepwise(steps: tuple[tuple, ...], buffers: list, reduce, copy, comm: MPI.Comm, tag: int) -> None:
    """Run compiled steps (CompiledSchedule.steps) to the end. Messages go as bytes: [region,
    MPI.BYTE]; a message of another size than its receive raises MismatchError."""
    status = _STATUS
    try:
        for step in steps:
            kind = step[0]
            if kind is EXCHANGE:
                _, to, (s, ss), source, (r, rs) = step
                into = buffers[r] if rs is None else buffers[r][rs]
                comm.Sendrecv([buffers[s] if ss is None else buffers[s][ss], BYTE], to, tag, [into, BYTE], source, tag,
                              status)
                if status.Get_count(BYTE) != into.nbytes:
                    raise wrong_size(comm, source, status.Get_count(BYTE), into.nbytes)
            elif kind is REDUCE:
                (d, ds), (a, as_), (b, bs) = step[1:]
                reduce(buffers[a] if as_ is None else buffers[a][as_], buffers[b] if bs is None else buffers[b][bs],
                       buffers[d] if ds is None else buffers[d][ds])
            elif kind is COPY:
                (d, ds), (s, ss) = step[1:]
                copy(buffers[d] if ds is None else buffers[d][ds], buffers[s] if ss is None else buffers[s][ss])
            else:
                _, peer, (b, bs) = step
                region = buffers[b] if bs is None else buffers[b][bs]
                if kind is SEND:
                    comm.Send([region, BYTE], peer, tag)
                else:
                    comm.Recv([region, BYTE], peer, tag, status)
                    if status.Get_count(BYTE) != region.nbytes:
                        raise wrong_size(comm, peer, status.Get_count(BYTE), region.nbytes)
    except MPI.Exception as error:
        peer = step[3] if step[0] is EXCHANGE else step[1]  # an exchange names the rank it receives from
        ours = translated(error_classes(error, [status]), comm, True, peer)
        if ours is None:
            raise
        raise ours from None
