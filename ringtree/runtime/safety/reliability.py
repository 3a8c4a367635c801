"""Errors instead of hangs: timeouts (check mode, the other way, is agreement.py).

Timeouts (`timeout=` seconds, or RINGTREE_TIMEOUT): a collective that completes
no message for that long raises TimeoutError. Before raising, the rank asks
every other rank, on a second private communicator, whether it is inside a
ringtree collective there: ranks waiting in one answer from their wait loop,
and ranks that timed out first have already asked. The ranks that neither
answer nor ask within a grace period are named as not in the collective. Then
the rank tells every other rank that it gave the call up (`give_up`): a rank
waiting in that call raises at once, and one that comes to it later raises
at its end (`check_given_up`), though the messages it needed may have arrived,
so that no rank goes on with the communicator that another left. The
timed-out collective's receives are cancelled and the communicator is marked
unusable, so the program can report the error and exit.
"""

from __future__ import annotations

import time

from mpi4py import MPI

from ...errors import TimeoutError
from ...words import counted
from .backoff import Backoff
from .mismatch import CALL, GAVE_UP, UNKNOWN, keep_report, ranks_text, tell

__all__ = ["answer_questions", "take_in", "timed_out", "execution_timed_out", "whereabouts", "give_up", "given_up",
           "check_given_up"]

PING, PRESENT = 1, 2  # tags on the control communicator (mismatch.py's CALL is 3)
# How long a timed-out rank listens for the others' answers, and how often a waiting rank looks for questions.
GRACE_SECONDS = 0.5
ANSWER_EVERY_SECONDS = 0.005


def answer_questions(state, seq: int) -> None:
    """Tell every rank that asked that this rank is in collective #seq (from a wait loop)."""
    status = MPI.Status()
    while (probed := state.control.improbe(MPI.ANY_SOURCE, PING, status)) is not None:
        probed.recv()
        state.send_control(seq, status.Get_source(), PRESENT)


def take_in(state, seq: int) -> list[tuple]:
    """Every message waiting on the control communicator: each rank that asks who is here told that this
    rank is in call #seq; the other ranks' reports (mismatch.tell) kept, and returned as (rank, report); a late answer
    to a question of this rank's dropped. Until two probes in a row find nothing: MPICH takes in one
    message that has come since its last progress per probe, and finds it on the next. Matched probes:
    another thread (the progress thread's end of a call) may take in at once, and each message is one's."""
    control, status = state.control, MPI.Status()
    reports, misses = [], 0
    while misses < 2:
        probed = control.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        if probed is None:
            misses += 1
            continue
        misses = 0
        source, tag = status.Get_source(), status.Get_tag()
        message = probed.recv()
        if tag == PING:
            state.send_control(seq, source, PRESENT)
        elif tag == CALL:
            reports.append((source, keep_report(state, source, message)))
    return reports


def execution_timed_out(execution, waiting: list[int], timeout: float) -> TimeoutError:
    """timed_out for one of the engine's collectives, with its ops still in flight (`waiting`, by
    index): the first says what it waits for."""
    schedule = execution.compiled.schedule
    what = (f"ringtree {schedule.collective.name} #{execution.seq} on rank {execution.state.rank} of "
            f"{execution.state.name} ({schedule.algorithm}, {counted(schedule.count, 'element')})")
    waits_for = ""
    if waiting:
        op = schedule.ops[waiting[0]]
        waits_for = f"it waits for op {waiting[0]} ({op}): rank {op.peer}"
    return timed_out(execution.state, execution.seq, what, timeout, waits_for)


def timed_out(state, seq: int, what: str, timeout: float, waits_for: str) -> TimeoutError:
    """The error of call #seq (`what`, as the message names it), which made no progress for `timeout`
    seconds, waiting as `waits_for` says: which ranks are not in it, asked first. The other ranks are
    told that this rank gave the call up, and the communicator is unusable."""
    present = _ask_who_is_here(state, seq)
    missing = [r for r in range(state.size) if r != state.rank and r not in present]
    elsewhere = {r: s for r, s in present.items() if s != seq}
    text = f"{what} made no progress for {timeout:g} s" + (f"; {waits_for}" if waits_for else "")
    return give_up(state, seq, TimeoutError(text + whereabouts(missing, elsewhere), missing, elsewhere))


def whereabouts(missing: list[int], elsewhere: dict[int, int]) -> str:
    text = ""
    if missing:
        text += f"; not in any ringtree collective on this communicator: {ranks_text(missing)}"
    if elsewhere:
        text += "; in another call: " + ", ".join(f"rank {r} in #{s}" for r, s in sorted(elsewhere.items()))
    return text


def give_up(state, seq: int, error: Exception) -> Exception:
    """This rank gives call #seq up with `error` (a timeout): the other ranks are told, so that a rank in
    that call, or coming to it later, raises too; the communicator is unusable. Returned to raise."""
    if state.broken is None:  # else the others were told what broke it
        tell(state, seq, UNKNOWN, True, GAVE_UP + str(error))
    state.broken = error
    return error


def given_up(state, seq: int, collective: str) -> TimeoutError | None:
    """The error of call #seq where another rank has given it, or an earlier call, up; else None."""
    gave = state.given_up
    if gave is None or gave[0] > seq:
        return None
    their_seq, source, why = gave
    call = "this call" if their_seq == seq else f"call #{their_seq}"
    error = TimeoutError(f"ringtree {collective} #{seq} on rank {state.rank} of {state.name}: rank {source} gave "
                         f"{call} up after its timeout, so no rank may go on with it ({why})", given_up_by=source)
    state.broken = error
    return error


def check_given_up(state, seq: int, collective: str) -> None:
    """At the end of call #seq with a timeout: raise if another rank has given it up meanwhile (its
    messages may all have arrived before that rank left)."""
    take_in(state, seq)
    error = given_up(state, seq, collective)
    if error is not None:
        raise error


def _ask_who_is_here(state, seq: int) -> dict[int, int]:
    """{rank: its call number} for the ranks that answer, or ask themselves, within the grace period."""
    others = [r for r in range(state.size) if r != state.rank]
    asks = [state.control.isend(seq, r, PING) for r in others]
    present: dict[int, int] = {}
    status = MPI.Status()
    deadline, backoff = time.perf_counter() + GRACE_SECONDS, Backoff()
    while len(present) < len(others) and time.perf_counter() < deadline:
        probed = state.control.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        if probed is not None:
            backoff.moved()
            source, tag = status.Get_source(), status.Get_tag()
            their_seq = probed.recv()
            if tag == CALL:  # a rank's signature (mismatch.py): it is in that call
                keep_report(state, source, their_seq)
                their_seq = their_seq[0]
            present[source] = their_seq
            if tag == PING:
                state.send_control(seq, source, PRESENT)
        else:
            backoff.empty()
    for request in asks:
        request.Free()
    return present
