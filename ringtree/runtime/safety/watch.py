"""A wait that looks, while idle, for signs that its call will not end as it should: another rank's
signature for the call, a message of it under another signature, a rank's word that it raised, refused
or gave the call up, a dead shared-memory peer, or the wait's own timeout (mismatch.py, reliability.py).
Every wait makes one once idle and calls `look()` between polls, as the back-off says."""

from __future__ import annotations

import time

from mpi4py import MPI

from ...errors import MismatchError
from .mismatch import ANNOUNCE_SECONDS, GAVE_UP, REFUSED, Signature, everywhere, seen, tell
from .reliability import given_up, take_in, timed_out

__all__ = ["Watch", "differs", "reported"]


def differs(theirs: tuple, signature: Signature, threads: bool, compare: bool = True) -> bool:
    """Whether a rank's report of a call (mismatch.tell) shows that it raised, or makes the call otherwise than
    this rank: with another signature (where `compare`), or with no element where this rank has some
    (runtime/engine/empty.py)."""
    empty = not theirs[2] and theirs[1].count == 0 and signature.count != 0
    return theirs[2] or empty or compare and (theirs[1] != signature or theirs[4] != threads)


def reported(source: int, theirs: tuple, seq: int) -> str:
    """Why a report that `differs` shows a mismatch, for the error."""
    return f"rank {source} reports " + (f"a mismatch in call #{seq}" if theirs[2] else "another signature for this call")


class Watch:
    """A wait in one call, looking for signs of a mismatch while idle: `look()` between polls."""

    __slots__ = ("state", "seq", "signature", "started", "announced", "abandon", "compare", "timeout", "waits_for")

    def __init__(self, state, seq: int, signature: Signature, abandon=None, announce: bool = False,
                 compare: bool = True, timeout: float | None = None, waits_for: str = "") -> None:
        """`abandon(error)`, if given, undoes what the call left in flight (engine.Execution.abandon).
        `announce`: a wait in MPI's own allreduce, whose messages show nothing of its call, tells the
        others which call it is in once idle ANNOUNCE_SECONDS. `compare=False`: a wait in the
        comparison of the call's arguments (agreement.agree), which compares them itself, looks
        only for a rank's word that it raised or refused the call, or that it makes the call with no
        elements (runtime/engine/empty.py): the plan, whose signature tags the messages of ranks already
        past the comparison, may be one made for an earlier call.
        `timeout`: seconds after which the wait, idle since `started` (the Watch made, or the call's
        last progress), raises TimeoutError (`waits_for` says in what); the communicator's own
        (CommState.timeout) where the call has none."""
        self.state, self.seq, self.signature, self.abandon = state, seq, signature, abandon
        self.started = time.perf_counter()
        self.announced = not announce
        self.compare = compare
        self.timeout, self.waits_for = timeout, waits_for

    def look(self) -> None:
        """Raise MismatchError on every rank if a message or another rank's signature shows that the
        ranks differ in this call, TimeoutError if a rank gave it up or it waited past its timeout;
        answer the ranks that ask who is here; tell the others which call this rank is in once it has
        waited ANNOUNCE_SECONDS."""
        state, seq = self.state, self.seq
        if isinstance(state.broken, MismatchError):  # another thread of this rank found it (and took in our messages)
            self.fail("")
        if state.given_up is not None:  # told in another wait
            self._given_up()
        self._reports()
        self._messages()
        now = time.perf_counter()
        timeout = self.timeout if self.timeout is not None else state.timeout
        if timeout is not None and now - self.started > timeout:
            what = f"ringtree {self.signature.collective} #{seq} on rank {state.rank} of {state.name} " \
                   f"({self.signature.described()})"
            self._raise(timed_out(state, seq, what, timeout, self.waits_for))
        if not self.announced and now - self.started > ANNOUNCE_SECONDS:
            self.announced = state.announced = True  # state.free keeps the communicators: the others may not take it
            tell(state, seq, self.signature, False)

    def _reports(self) -> None:
        """The other ranks' reports on the control communicator (taken in, and those kept before): a
        mismatch, a refusal, another signature for this call, a call given up."""
        state, seq = self.state, self.seq
        for source, theirs in take_in(state, seq):  # their reports of this call are in state.reports too
            if theirs[3].startswith(GAVE_UP):
                self._given_up()  # else a later call's: this rank raises when it comes to that call
            elif theirs[3] and not theirs[3].startswith(REFUSED):  # a rank found two threads in calls on it at once
                self.fail(f"rank {source} reports: {theirs[3]}")
        threads = bool(state.threads_bit)
        for source, theirs in list(state.reports.get(seq, {}).items()):
            if theirs[3].startswith(REFUSED):  # a refusal of this call, told before it began here too
                self.fail(f"rank {source} refused call #{seq}")
            if differs(theirs, self.signature, threads, self.compare):
                self.fail(reported(source, theirs, seq))

    def _messages(self) -> None:
        """The messages waiting on the private communicator: a notice of a mismatch in this call, a
        message of it under another signature."""
        state, seq = self.state, self.seq
        status = MPI.Status()
        layout, comm, me = state.layout, state.comm, state.rank
        mine = layout.tag(seq, self.signature.code ^ state.threads_bit)
        for source in range(state.size):
            if source == me or not comm.Iprobe(source, MPI.ANY_TAG, status):
                continue
            tag = status.Get_tag()
            if tag == layout.notice_of(seq):
                self.fail(seen(source, tag, layout))
            self._another_signature(source, tag, mine)

    def _another_signature(self, source: int, tag: int, mine: int) -> None:
        """Fail if `tag`, of a message from `source`, is of this call's number but not of its signature."""
        layout = self.state.layout
        if self.compare and tag // layout.codes == self.seq % layout.calls and tag != mine:
            self.fail(seen(source, tag, layout))

    def _given_up(self) -> None:
        """Raise where another rank gave this call, or an earlier one, up (reliability.give_up)."""
        error = given_up(self.state, self.seq, self.signature.collective)
        if error is not None:
            self._raise(error)

    def fail(self, why: str):
        self._raise(everywhere(self.state, self.seq, self.signature, why))

    def _raise(self, error: Exception):
        if self.abandon is not None:
            self.abandon(error)
        raise error
