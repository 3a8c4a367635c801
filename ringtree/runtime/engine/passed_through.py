"""A call that MPI's own collective computes for ringtree (a user-defined op, MAXLOC, a derived datatype,
displacements with gaps: api/converted.py) is a ringtree call all the same. It is counted as every
call is and runs on a communicator of its signature's own, made at the first call of that signature on
every rank once the ranks agree on it (as a native plan's, native.native_plan), so that such calls
which differ between ranks never match inside MPI. It is waited for as MPI's own allreduce is:
ringtree's calls in flight progress, an idle wait tells the others its signature and looks for
theirs (a rank that makes another call raises MismatchError on every rank), and the call's timeout
and the stall warning hold."""

from __future__ import annotations

from functools import partial

from ..safety.backoff import backed_off, settled
from ..safety.mismatch import Signature
from ..safety.reliability import check_given_up
from ..safety.stalls import watched
from ..safety.watch import Watch
from .in_flight import progress_others
from .native import QUIET_SECONDS, native_plan

__all__ = ["PassedThrough"]

# Kept per communicator, one per signature (an allreduce's count among it: calls that differ only in
# their count must not meet inside MPI, which would not tell them apart; another collective's counts
# MPI checks itself); the least recently used freed to make room.
COMMUNICATORS = 16


class PassedThrough:
    """MPI's own collective of one call, started by `start(comm)` on the communicator of its signature:
    what a Request tests and waits on. `arrays`: what MPI writes into, kept with a broken state."""

    __slots__ = ("state", "comm", "seq", "signature", "request", "timeout", "what", "done", "arrays")

    def __init__(self, state, signature: Signature, timeout: float | None, start, arrays: tuple = ()) -> None:
        self.state, self.comm, self.signature, self.timeout, self.arrays = state, state.comm, signature, timeout, arrays
        self.what = f"{signature.collective} on rank {state.rank} of {state.name} ({signature.described()}), in MPI's own"
        own = state.passed_through.pop(signature, None)
        if own is None:  # made with the other ranks: a wait, watched
            own = watched(partial(_communicator, state, signature, timeout), self.what)
        else:  # the most recently used last: the least recently used is freed to make room
            state.passed_through[signature] = own
        self.request = start(own)
        self.seq = state.next_call()
        self.done = False

    def test(self) -> bool:
        if not self.done:
            progress_others()
            self.done = self.request.Test()
        if self.done and self.timeout is not None:  # its messages may have come from a rank that left it since
            check_given_up(self.state, self.seq, self.signature.collective)
        return self.done

    def wait(self) -> None:
        if not self.done:
            if not settled(self.request.Test, progress_others):
                watched(self._waited, self.what)
            self.done = True
        if self.timeout is not None:
            check_given_up(self.state, self.seq, self.signature.collective)

    def _waited(self) -> None:
        watch = partial(Watch, self.state, self.seq, self.signature, self._left, announce=True, timeout=self.timeout,
                        waits_for=f"it waits in MPI's own {self.signature.collective}")
        backed_off(self.request.Test, progress_others, QUIET_SECONDS, watch)

    def _left(self, error: Exception) -> None:
        """Left by an error: MPI may still write into the call's arrays, which the broken state keeps."""
        self.state.abandoned.append((self.request, self.arrays))


def _communicator(state, signature: Signature, timeout: float | None):
    """The communicator of calls of `signature`, made at the first such call, the same on every rank."""
    if len(state.passed_through) >= COMMUNICATORS:
        state.passed_through.pop(next(iter(state.passed_through))).Free()
    own = native_plan(None, None, state, signature.count, None, signature, None, timeout=timeout)
    state.passed_through[signature] = own.comm
    return own.comm
