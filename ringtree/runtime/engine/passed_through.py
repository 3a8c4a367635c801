"""A call that MPI's own collective computes for ringtree (a user-defined op, MAXLOC, a derived datatype,
displacements with gaps: api/converted.py) is a ringtree call all the same. It is counted as every
call is and runs on a communicator of its signature's own, made at the first call of that signature on
every rank once the ranks agree on it (as a native plan's, native.native_plan), so that such calls
which differ between ranks never match inside MPI. It is in flight as MPI's own collectives are (NativeInFlight):
ringtree's calls in flight progress, an idle wait tells the others its signature and looks for
theirs (a rank that makes another call raises MismatchError on every rank), and the call's timeout
and the stall warning hold."""

from __future__ import annotations

from functools import partial

from ..safety.mismatch import Signature
from ..safety.stalls import watched
from .native import MPICollective, NativeInFlight, native_plan

__all__ = ["pass_through"]

# Kept per communicator, one per signature (an allreduce's count among it: calls that differ only in
# their count must not meet inside MPI, which would not tell them apart; another collective's counts
# MPI checks itself); the least recently used freed to make room.
COMMUNICATORS = 16


def pass_through(state, signature: Signature, timeout: float | None, start, arrays: tuple = ()) -> NativeInFlight:
    """MPI's own collective of one call, started by `start(comm)` on the communicator of its signature:
    in flight as MPI's own are (NativeInFlight). `arrays`: what MPI writes into, kept with a broken state."""
    what = f"{signature.collective} on rank {state.rank} of {state.name} ({signature.described()}), in MPI's own"
    own = state.passed_through.pop(signature, None)
    if own is None:  # made with the other ranks: a wait, watched
        own = watched(partial(_plan, state, signature, timeout), what)
    else:  # the most recently used last: the least recently used is freed to make room
        state.passed_through[signature] = own
    return NativeInFlight(own, state, arrays, None, False, None, what, partial(start, own.comm), timeout)


def _plan(state, signature: Signature, timeout: float | None) -> MPICollective:
    """The plan of calls of `signature` (a communicator of their own), made at the first such call, the
    same on every rank."""
    if len(state.passed_through) >= COMMUNICATORS:
        state.passed_through.pop(next(iter(state.passed_through))).comm.Free()
    own = state.passed_through[signature] = native_plan(None, None, state, signature.count, None, signature, None,
                                                        timeout=timeout)
    return own
