"""Errors instead of hangs: check mode (ranks agree on each call before moving data) and timeouts.

Check mode (`check=True`, `Communicator(check=True)` or RINGTREE_CHECK=1): before
each allreduce the ranks allreduce a small record, (count, dtype, op,
algorithm, call number) and its negation with MIN, so its minimum and maximum
tell whether all agree. If not, they gather the records and every rank raises
MismatchError naming each value and the ranks that hold it.

Timeouts (`timeout=` seconds, or RINGTREE_TIMEOUT): a collective that completes
no message for that long raises TimeoutError. Before raising, the rank asks
every other rank, on a second private communicator, whether it is inside a
ringtree collective there: ranks waiting with a timeout answer from their wait
loop, and ranks that timed out first have already asked. The ranks that neither
answer nor ask within a grace period are named as not in the collective. The
timed-out collective's receives are cancelled and the communicator is marked
unusable, so the program can report the error and exit.

Without check mode, the calls' signatures in their messages' tags still catch
ranks that call differently (mismatch.py).
"""

from __future__ import annotations

import time
import zlib
from functools import partial

import numpy as np
from mpi4py import MPI

from ..errors import MismatchError, TimeoutError
from .backoff import Backoff, wait_until
from .mismatch import CALL, Signature, Watch, ranks_text
from .stalls import watched

PING, PRESENT = 1, 2  # tags on the control communicator (mismatch.py's CALL is 3)
# How long a timed-out rank listens for the others' answers, and how often a waiting rank looks for questions.
GRACE_SECONDS = 0.5
ANSWER_EVERY_SECONDS = 0.005


_FIELDS = ("count", "dtype", "op", "algorithm", "collective", "call number")
_SEQ = len(_FIELDS) - 1


def call_record(count: int, dtype, op: str, algorithm: str, collective: str = "allreduce") -> np.ndarray:
    """What check mode compares, as int64 codes, then their negations (the call number goes in last
    of each): a MIN allreduce of it gives every field's minimum and maximum at once. Then as many
    elements again, for the result. `collective`: its name, root and blocks, for another than allreduce."""
    codes = np.array([count, _code(dtype.str), _code(op), _code(algorithm), _code(collective), 0], np.int64)
    return np.concatenate([codes, -codes, np.zeros(2 * len(_FIELDS), np.int64)])


def agree(state, record: np.ndarray, call: tuple, signature: Signature, timeout: float | None, blocking: bool,
          ringtree_allreduce, what: str | None = None) -> None:
    """Raise MismatchError on every rank unless all ranks make this call with the same arguments.

    `record` is call_record's for this call, `call` its (count, dtype, op, algorithm, collective)
    for the message, `signature` its signature (mismatch.py).
    With a timeout the comparison runs through ringtree (`ringtree_allreduce(sendbuf, recvbuf,
    timeout)`, MIN over int64), so that a rank that does not come is named, and so it does where
    other threads call ringtree (not `blocking`); else through MPI's own nonblocking allreduce on
    the private communicator, polled, looking for a rank that refused the call or made another.
    `what`: the wait as a stall warning names it, where the caller has it made already."""
    seq = state.calls  # the same on all ranks if they made as many ringtree calls
    fields = len(_FIELDS)
    record[_SEQ], record[fields + _SEQ] = seq, -seq
    mine, low = record[:2 * fields], record[2 * fields:]
    count, dtype, op, algorithm, collective = call
    name = collective.split()[0]
    if timeout is None and blocking:
        watched(partial(_compared, state, mine, low, seq, signature), what or agreement_described(state, call))
    else:
        try:
            ringtree_allreduce(mine, low, timeout)
        except TimeoutError as error:  # said of the user's call, not of the comparison's own allreduce
            state.broken = TimeoutError(
                f"ringtree {name} on rank {state.rank} of {state.comm.Get_name()} ({count} elements of {dtype.name}, "
                f"{op}, algorithm {algorithm}): not every rank came to {_comparison(name)} of this call's "
                f"arguments (ringtree call #{seq}) within {timeout:g} s"
                + _whereabouts(error.missing, error.elsewhere), error.missing, error.elsewhere)
            raise state.broken from None
    smallest = low.tolist()
    if smallest[:fields] == [-value for value in smallest[fields:]]:
        return
    everyone = state.comm.allgather((count, dtype.name, op, algorithm, collective, seq))  # rare: who differs
    differences = []
    for k, field in enumerate(_FIELDS):
        holders: dict = {}
        for rank, value in enumerate(everyone):
            holders.setdefault(value[k], []).append(rank)
        if len(holders) > 1:
            differences.append(f"{field}: " + "; ".join(f"{value!r} on {ranks_text(ranks)}" for value, ranks in holders.items()))
    raise MismatchError(f"ringtree {name} on rank {state.rank}: the ranks of {state.comm.Get_name()} disagree "
                        f"at call #{seq}: " + " | ".join(differences))


def _compared(state, mine: np.ndarray, low: np.ndarray, seq: int, signature: Signature) -> None:
    """MPI's own MIN allreduce of the records, polled, with a look for signs of a mismatch now and then."""
    request = state.comm.Iallreduce(mine, low, MPI.MIN)
    wait_until(request.Test, watch=(_comparison_watch, state, seq, signature, request, mine, low))


def _comparison_watch(state, seq: int, signature: Signature, request, mine, low) -> Watch:
    """The Watch of a comparison idle for a while: left by a mismatch, its request and arrays stay with
    the state (MPI may still write into them)."""
    return Watch(state, seq, signature, lambda error: state.abandoned.append((request, mine, low)), compare=False)


def agreement_described(state, call: tuple) -> str:
    """The wait in agree(), as a stall warning names it."""
    count, dtype, op, algorithm, collective = call
    name = collective.split()[0]
    return (f"{name} on rank {state.rank} of {state.comm.Get_name()} ({count} elements of "
            f"{dtype.name}, {op}, algorithm {algorithm}), in {_comparison(name)} of the ranks' arguments")


def _comparison(collective: str) -> str:
    """An allreduce compares its arguments in check mode only; a broadcast or reduce by default too."""
    return "check mode's comparison" if collective == "allreduce" else "the comparison"


def _code(text: str) -> int:
    return zlib.crc32(text.encode())


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
    text = (f"ringtree allreduce #{seq} on rank {state.rank} of {state.comm.Get_name()} "
            f"({schedule.algorithm}, {schedule.count} elements) made no progress for {timeout:g} s")
    if waiting:
        op = schedule.ops[waiting[0]]
        text += f"; it waits for op {waiting[0]} ({op}): rank {op.peer}"
    return TimeoutError(text + _whereabouts(missing, elsewhere), missing, elsewhere)


def _whereabouts(missing: list[int], elsewhere: dict[int, int]) -> str:
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
