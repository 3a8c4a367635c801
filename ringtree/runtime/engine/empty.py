"""A call with nothing to move (no element on any rank, as this rank's arguments say). It would send no
message and end at once, leaving ranks that make the call with elements waiting for it, and no other
rank would learn of the difference. So it tells every other rank its signature (a report on the
control communicator, as a stalled wait announces one) and waits for theirs: where a rank makes the
call otherwise, the ranks raise MismatchError on every rank, naming what differs (a rank waiting in
the call with elements sees the empty call's report, mismatch.py's Watch), and where every rank makes
it empty, each ends once it has heard from all."""

from __future__ import annotations

from functools import partial

from ..safety.backoff import wait_until
from ..safety.mismatch import Signature, everywhere, tell
from ..safety.reliability import given_up, take_in
from ..safety.stalls import watched
from ..safety.watch import Watch, differs, reported
from .in_flight import progress_others

__all__ = ["EmptyCall"]


class EmptyCall:
    """An empty call in flight (a call like any other: counted, with its signature): what a Request
    tests and waits on, or waited for at once."""

    __slots__ = ("state", "comm", "seq", "signature", "timeout", "what", "done")

    def __init__(self, state, signature: Signature, timeout: float | None) -> None:
        self.state, self.comm, self.signature, self.timeout = state, state.comm, signature, timeout
        self.seq = state.calls  # counted as every call is (CommState.next_tag)
        state.calls = self.seq + 1
        self.what = (f"{signature.collective} on rank {state.rank} of {state.name} ({signature.described()}), "
                     "for the other ranks' word that they make it with no elements too")
        self.done = False
        tell(state, self.seq, signature, False)

    def test(self) -> bool:
        if not self.done:
            progress_others()
            self.done = self._heard()
        return self.done

    def wait(self) -> None:
        if self.done:
            return
        watch = partial(Watch, self.state, self.seq, self.signature, timeout=self.timeout,
                        waits_for="it waits for the other ranks' signatures")
        watched(partial(wait_until, self._heard, progress_others, 0.0, watch), self.what)
        self.done = True

    def _heard(self) -> bool:
        """Whether every other rank has told the same signature for this call; MismatchError on every rank
        where one told another, or raised."""
        state, seq = self.state, self.seq
        take_in(state, seq)
        error = given_up(state, seq, self.signature.collective)
        if error is not None:
            raise error
        reports = state.reports.get(seq, {})
        threads = bool(state.threads_bit)
        for source, theirs in reports.items():
            if differs(theirs, self.signature, threads):
                raise everywhere(state, seq, self.signature, reported(source, theirs, seq))
        return len(reports) == state.size - 1
