"""The stepwise path: a blocking call of a small schedule, run a step at a time.

Each step is an exchange with a peer, a send, a receive, a reduction or a
copy, in the schedule's listed order (schedule.order.steps), each waited for
before the next. That costs less per message than the engine's bookkeeping,
and an algorithm that exchanges with one partner at a time leaves the engine
nothing to overlap. It runs only when no other collective is in flight in
this process at its start (tuning/selector.py says up to which sizes); its
waits progress those that other threads start meanwhile.
"""

from __future__ import annotations

from functools import partial

from mpi4py import MPI

from ...errors import MismatchError, TimeoutError
from ...schedule import OpKind
from ..safety.backoff import wait_until
from ..safety.failures import error_classes, translated, wrong_size
from ..safety.mismatch import Evidence, Signature, everywhere
from ..safety.threads import THREADS
from ..safety.watch import Watch
from . import timeline
from .compiled import EXCHANGE
from .in_flight import IN_FLIGHT, progress_others

__all__ = ["bound_steps", "may_step", "run_stepwise"]

BYTE, ANY_TAG = MPI.BYTE, MPI.ANY_TAG
# Messages up to this size go out at once under every MPI we know (Open MPI's shared memory sends
# 4 KiB eagerly, MPICH's more): a blocking send of one cannot wait for a peer that makes another call.
EAGER_BYTES = 1024
# Open MPI 5's ob1 writes the whole of a large message into a receive it matches and truncates, past
# its end (docs/reliability.md); MPICH truncates safely. Under any MPI but MPICH a receive that takes
# any tag is posted only once a probe has shown its message to be of this call and of its size.
PROBE_FIRST = not MPI.Get_library_version().startswith("MPICH")
SEND, RECV, REDUCE, COPY = OpKind.SEND, OpKind.RECV, OpKind.REDUCE, OpKind.COPY


def may_step(state, timeout) -> bool:
    """Whether a blocking call may run a step at a time now: no timeout (its waits keep none), no
    engine's collective running (a receive of any tag would take its messages), no timeline to
    record, and a mismatch visible to its waits (with threads and signatures off, a step waits inside
    MPI, where no other thread may)."""
    return (timeout is None and not IN_FLIGHT.running and not timeline.TIMELINE.active
            and (state.signatures or not THREADS.several))


def bound_steps(steps: tuple[tuple, ...], buffers: list, remote: tuple) -> tuple[tuple, ...]:
    """Compiled steps (CompiledSchedule.steps) bound to a call's buffers: each region made an array
    (a message's as [region, MPI.BYTE]), once, so that a call repeated on the same arrays reuses them.
    First the MPI.Status its receives fill, then (EXCHANGE, send, to, receive, from, receive bytes,
    how), (SEND, message, to, how), (RECV, message, from, bytes), (REDUCE, left, right, out),
    (COPY, to, from), where `how` a message is sent is None for a blocking Send (up to EAGER_BYTES,
    within a node), else MPI.Comm.Isend, or MPI.Comm.Issend to a rank on another node (`remote`,
    CommState.remote: pipelined.py says why)."""
    def region(buffer, elements):
        return buffers[buffer] if elements is None else buffers[buffer][elements]

    def how(to: int, nbytes: int):
        return MPI.Comm.Issend if remote[to] else None if nbytes <= EAGER_BYTES else MPI.Comm.Isend

    bound: list = [MPI.Status()]  # first: the status its receives fill, its own, as threads may run others at once
    for step in steps:
        kind = step[0]
        if kind is EXCHANGE:
            _, to, send, source, receive = step
            into, out = region(*receive), region(*send)
            bound.append((EXCHANGE, [out, BYTE], to, [into, BYTE], source, into.nbytes, how(to, out.nbytes)))
        elif kind is REDUCE:
            _, out, left, right = step
            bound.append((REDUCE, region(*left), region(*right), region(*out)))
        elif kind is COPY:
            bound.append((COPY, region(*step[1]), region(*step[2])))
        else:
            message = region(*step[2])
            bound.append((kind, [message, BYTE], step[1], how(step[1], message.nbytes) if kind is SEND else message.nbytes))
    return tuple(bound)


def run_stepwise(steps: tuple[tuple, ...], reduce, copy, state, signature: Signature) -> None:
    """Run bound steps (`bound_steps`) of a call of `signature` on `state`'s communicator to the end.
    Messages go as bytes, tagged with the call's signature (mismatch.py). A receive takes any tag
    from its peer, so that a message of a call that differs, or a rank's notice of a mismatch, ends
    it; every wait polls, looking for signs of a mismatch while idle, as a rank blocked inside MPI
    could wait for ever on ranks that make another call. Either, or a message of another size than
    its receive, raises MismatchError on every rank. With RINGTREE_SIGNATURES=0, each step waits
    inside MPI, and a message of another size raises MismatchError on this rank only; but where the
    communicator has a timeout of its own (CommState.timeout), which only a polled wait keeps."""
    comm = state.comm
    tag = state.next_tag(signature.code)
    if not state.signatures and state.timeout is None:
        _run_blocking(steps, reduce, copy, comm, tag, signature.collective)
        return
    status = steps[0]
    received = sent = None
    try:
        for step in steps[1:]:
            kind = step[0]
            if kind is EXCHANGE:
                _, send, to, receive, source, nbytes, how = step
                received = None if PROBE_FIRST else comm.Irecv(receive, source, ANY_TAG)
                sent = None
                if how is None:  # MPI sends it at once: a blocking send cannot wait on the peer
                    comm.Send(send, to, tag)
                else:
                    sent = how(comm, send, to, tag)
                if received is None:
                    received = _probed(comm, receive, source, tag, nbytes, status, state, signature)
                if not received.Test(status):
                    _wait(received, status, state, signature)
                if status.Get_tag() != tag or status.Get_count(BYTE) != nbytes:
                    _expected(comm, receive, source, tag, nbytes, status, state, signature)
                if sent is not None and not sent.Test():
                    _wait(sent, None, state, signature)
            elif kind is REDUCE:
                _, left, right, out = step
                reduce(left, right, out)
            elif kind is COPY:
                copy(step[1], step[2])
            elif kind is SEND:
                if step[3] is None:
                    comm.Send(step[1], step[2], tag)
                else:
                    sent = step[3](comm, step[1], step[2], tag)
                    if not sent.Test():
                        _wait(sent, None, state, signature)
            else:
                _, message, source, nbytes = step
                if PROBE_FIRST:
                    received = _probed(comm, message, source, tag, nbytes, status, state, signature)
                else:
                    received = comm.Irecv(message, source, ANY_TAG)
                if not received.Test(status):
                    _wait(received, status, state, signature)
                if status.Get_tag() != tag or status.Get_count(BYTE) != nbytes:
                    _expected(comm, message, source, tag, nbytes, status, state, signature)
    except Evidence as evidence:
        _cancel(received, sent, state, steps)
        raise everywhere(state, state.calls - 1, signature, evidence.why(state.layout)) from None
    except MPI.Exception as error:
        _cancel(received, sent, state, steps)
        peer = step[4] if step[0] is EXCHANGE else step[2]  # an exchange names the rank it receives from
        ours = translated(error_classes(error, [status]), comm, signature.collective, True, peer)
        if ours is None:
            raise
        if isinstance(ours, MismatchError):
            raise everywhere(state, state.calls - 1, signature,
                             f"a message from rank {peer} was larger than its receive") from None
        raise ours from None
    except (MismatchError, TimeoutError):  # another rank's, seen while waiting; or the communicator's timeout
        _cancel(received, sent, state, steps)
        raise


def _probed(comm, receive, source: int, tag: int, nbytes: int, status: MPI.Status, state, signature) -> MPI.Request:
    """The receive from `source` posted for the message a probe shows to be of `tag` and `nbytes`
    (PROBE_FIRST). A notice of another call is received and passed; any other message is received
    into a buffer of its own size, and Evidence raised."""
    seq, found = state.calls - 1, [None]

    def probed() -> bool:
        found[0] = comm.improbe(source, ANY_TAG, status)
        return found[0] is not None

    while True:
        wait_until(probed, progress_others, 0.0, partial(Watch, state, seq, signature))
        message = found[0]
        got_tag, got = status.Get_tag(), status.Get_count(BYTE)
        if got_tag == tag and got == nbytes:
            return message.Irecv(receive)
        _wait(message.Irecv([bytearray(got), BYTE]), None, state, signature)  # taken, so its sender is not left waiting
        if state.layout.stale(got_tag, seq):
            continue
        raise Evidence(wrong_size(source, got, nbytes)) if got_tag == tag else Evidence("", source, got_tag)


def _wait(request: MPI.Request, status: MPI.Status | None, state, signature: Signature) -> None:
    """Poll a request of the stepwise path, looking for a mismatch while idle (mismatch.Watch), and
    progressing the collectives other threads have in flight."""
    if not request.Test(status):  # most are done at once: nothing made for them
        wait_until(partial(request.Test, status), progress_others, 0.0, partial(Watch, state, state.calls - 1, signature))


def _cancel(received: MPI.Request | None, sent: MPI.Request | None, state, steps) -> None:
    """After a mismatch: a receive still posted must not land in the caller's array later; the
    steps' arrays are kept with the broken state, as a send let go may still read them."""
    state.abandoned.append(steps)
    try:
        if received is not None and received != MPI.REQUEST_NULL:
            received.Cancel()
            received.Wait()
        if sent is not None and sent != MPI.REQUEST_NULL:
            sent.Free()  # a send a peer may still take: MPI drops it at the end
    except MPI.Exception:
        pass


def _expected(comm, receive, source: int, tag: int, nbytes: int, status: MPI.Status, state, signature) -> None:
    """After a receive got another tag or size than its call's: receive again past notices of other
    calls (of a communicator before this one, whose context MPI gave this one); raise Evidence for
    anything else."""
    layout = state.layout
    seq = state.calls - 1
    while layout.stale(status.Get_tag(), seq):
        received = comm.Irecv(receive, source, ANY_TAG)
        if not received.Test(status):
            _wait(received, status, state, signature)
    if status.Get_tag() == tag and status.Get_count(BYTE) == nbytes:
        return
    if status.Get_tag() == tag:
        raise Evidence(wrong_size(source, status.Get_count(BYTE), nbytes))
    raise Evidence("", source, status.Get_tag())


def _run_blocking(steps: tuple[tuple, ...], reduce, copy, comm: MPI.Comm, tag: int, collective: str) -> None:
    """The steps with blocking MPI, each receive of `tag` only (RINGTREE_SIGNATURES=0); a send alone
    to another node synchronous, as every other send there. Its errors name `collective`."""
    status = steps[0]
    try:
        for step in steps[1:]:
            kind = step[0]
            if kind is EXCHANGE:
                _, send, to, receive, source, nbytes, _ = step
                comm.Sendrecv(send, to, tag, receive, source, tag, status)
                if status.Get_count(BYTE) != nbytes:
                    raise MismatchError(f"ringtree {collective} on rank {comm.Get_rank()}: "
                                        + wrong_size(source, status.Get_count(BYTE), nbytes))
            elif kind is REDUCE:
                _, left, right, out = step
                reduce(left, right, out)
            elif kind is COPY:
                copy(step[1], step[2])
            elif kind is SEND:
                (comm.Ssend if step[3] is MPI.Comm.Issend else comm.Send)(step[1], step[2], tag)
            else:
                _, message, source, nbytes = step
                comm.Recv(message, source, tag, status)
                if status.Get_count(BYTE) != nbytes:
                    raise MismatchError(f"ringtree {collective} on rank {comm.Get_rank()}: "
                                        + wrong_size(source, status.Get_count(BYTE), nbytes))
    except MPI.Exception as error:
        peer = step[4] if step[0] is EXCHANGE else step[2]  # an exchange names the rank it receives from
        ours = translated(error_classes(error, [status]), comm, collective, True, peer)
        if ours is None:
            raise
        raise ours from None
