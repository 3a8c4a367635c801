"""Errors instead of hangs: timeouts (check mode, the other way, is agreement.py).

Timeouts (`timeout=` seconds, or RINGTREE_TIMEOUT): a collective that completes
no message for that long raises TimeoutError. Before raising, the rank asks
every other rank, on a second private communicator, whether it is inside a
ringtree collective there: ranks waiting with a timeout answer from their wait
loop, and ranks that timed out first have already asked. The ranks that neither
answer nor ask within a grace period are named as not in the collective. The
timed-out collective's receives are cancelled and the communicator is marked
unusable, so the program can report the error and exit.

"""

from __future__ import annotations

import time

from mpi4py import MPI

from ..errors import TimeoutError
from .backoff import Backoff
from .mismatch import CALL, ranks_text

PING, PRESENT = 1, 2  # tags on the control communicator (mismatch.py's CALL is 3)
# How long a timed-out rank listens for the others' answers, and how often a waiting rank looks for questions.
GRACE_SECONDS = 0.5
ANSWER_EVERY_SECONDS = 0.005


def answer_questions(state, seq: int) -> None:
    """Tell every rank that asked that this rank is in collective #seq (from a wait loop)."""
    state.answers = [request for request in state.answers if not request.Test()]
    status = MPI.Status()
    while state.control.Iprobe(MPI.ANY_SOURCE, PING, status):
        source = status.Get_source()
        state.control.recv(source=source, tag=PING)
        state.answers.append(state.control.isend(seq, source, PRESENT))


def timed_out(execution, waiting: list[int], timeout: float) -> TimeoutError:
    """The error for a collective that made no progress for `timeout` seconds, with its ops still in
    flight (`waiting`, by index): what it waits for, and which ranks are not in it."""
    state, seq = execution.state, execution.seq
    schedule = execution.compiled.schedule
    present = _ask_who_is_here(state, seq)
    missing = [r for r in range(state.size) if r != state.rank and r not in present]
    elsewhere = {r: s for r, s in present.items() if s != seq}
    text = (f"ringtree {schedule.collective.name} #{seq} on rank {state.rank} of {state.comm.Get_name()} "
            f"({schedule.algorithm}, {schedule.count} elements) made no progress for {timeout:g} s")
    if waiting:
        op = schedule.ops[waiting[0]]
        text += f"; it waits for op {waiting[0]} ({op}): rank {op.peer}"
    return TimeoutError(text + whereabouts(missing, elsewhere), missing, elsewhere)


def whereabouts(missing: list[int], elsewhere: dict[int, int]) -> str:
    text = ""
    if missing:
        text += f"; not in any ringtree collective on this communicator: {ranks_text(missing)}"
    if elsewhere:
        text += "; in another call: " + ", ".join(f"rank {r} in #{s}" for r, s in sorted(elsewhere.items()))
    return text


def _ask_who_is_here(state, seq: int) -> dict[int, int]:
    """{rank: its call number} for the ranks that answer, or ask themselves, within the grace period."""
    others = [r for r in range(state.size) if r != state.rank]
    asks = [state.control.isend(seq, r, PING) for r in others]
    present: dict[int, int] = {}
    status = MPI.Status()
    deadline, backoff = time.perf_counter() + GRACE_SECONDS, Backoff()
    while len(present) < len(others) and time.perf_counter() < deadline:
        if state.control.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            backoff.moved()
            source, tag = status.Get_source(), status.Get_tag()
            their_seq = state.control.recv(source=source, tag=tag)
            if tag == CALL:  # a rank's signature (mismatch.py): it is in that call
                their_seq = their_seq[0]
            present[source] = their_seq
            if tag == PING:
                state.answers.append(state.control.isend(seq, source, PRESENT))
        else:
            backoff.empty()
    for request in asks:
        request.Free()
    return present
