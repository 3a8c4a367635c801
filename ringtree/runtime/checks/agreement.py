"""Check mode (`check=True`, `Communicator(check=True)` or RINGTREE_CHECK=1): the ranks agree on each
call before moving data. Before each call they allreduce a small record, (count, dtype, op,
algorithm, call number) and its negation with MIN, so its minimum and maximum tell whether all agree.
If not, they gather the records and every rank raises MismatchError naming each value and the ranks
that hold it. A broadcast or reduce compares its arguments so by default (api/collectives.py).

Without check mode, the calls' signatures in their messages' tags still catch ranks that call
differently (mismatch.py).
"""

from __future__ import annotations

import zlib
from functools import partial

import numpy as np
from mpi4py import MPI

from ...errors import MismatchError, TimeoutError
from ...ops import ReduceOp
from ...schedule.collectives import COLLECTIVES
from ...words import counted
from ..engine.in_flight import progress_others
from ..safety.backoff import wait_until
from ..safety.mismatch import Signature, differing
from ..safety.reliability import whereabouts
from ..safety.stalls import watched
from ..safety.watch import Watch
from ..session.small import small_allreduce

__all__ = ["call_record", "agree", "agreement_described"]

_FIELDS = ("count", "dtype", "op", "algorithm", "collective", "call number")
_SEQ = len(_FIELDS) - 1


def call_record(count: int, dtype, op: str, algorithm: str, collective: str = "allreduce") -> np.ndarray:
    """What check mode compares, as int64 codes, then their negations (the call number goes in last
    of each): a MIN allreduce of it gives every field's minimum and maximum at once. Then as many
    elements again, for the result. `collective`: its name, root and blocks, for another than allreduce."""
    codes = np.array([count, _code(dtype.str), _code(op), _code(algorithm), _code(collective), 0], np.int64)
    return np.concatenate([codes, -codes, np.zeros(2 * len(_FIELDS), np.int64)])


def agree(state, record: np.ndarray, call: tuple, signature: Signature, timeout: float | None, blocking: bool,
          what: str | None = None) -> None:
    """Raise MismatchError on every rank unless all ranks make this call with the same arguments.

    `record` is call_record's for this call, `call` its (count, dtype, op, algorithm, collective)
    for the message, `signature` its signature (mismatch.py).
    With a timeout the comparison runs through ringtree (small_allreduce, MIN over int64), so that a
    rank that does not come is named, and so it does where other threads call ringtree (not
    `blocking`); else through MPI's own nonblocking allreduce on
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
            small_allreduce(state, mine, low, ReduceOp.MIN, timeout)
        except TimeoutError as error:  # said of the user's call, not of the comparison's own allreduce
            if error.given_up_by is not None:  # another rank gave it up: its error says so
                raise
            state.broken = TimeoutError(
                f"ringtree {name} on rank {state.rank} of {state.comm.Get_name()} "
                f"({counted(count, 'element')} of {dtype.name}, "
                f"{op}, algorithm {algorithm}): not every rank came to {_comparison(name)} of this call's "
                f"arguments (ringtree call #{seq}) within {timeout:g} s"
                + whereabouts(error.missing, error.elsewhere), error.missing, error.elsewhere)
            raise state.broken from None
    smallest = low.tolist()
    if smallest[:fields] == [-value for value in smallest[fields:]]:
        return
    everyone = state.comm.allgather((count, dtype.name, op, algorithm, collective, seq))  # rare: who differs
    differences = []
    for k, field in enumerate(_FIELDS):
        differences += differing(field, {rank: value[k] for rank, value in enumerate(everyone)})
    raise MismatchError(f"ringtree {name} on rank {state.rank}: the ranks of {state.comm.Get_name()} disagree "
                        f"at call #{seq}: " + " | ".join(differences))


def _compared(state, mine: np.ndarray, low: np.ndarray, seq: int, signature: Signature) -> None:
    """MPI's own MIN allreduce of the records, polled while the collectives in flight progress (a rank may
    wait in one for this rank's part), with a look for signs of a mismatch now and then."""
    request = state.comm.Iallreduce(mine, low, MPI.MIN)
    wait_until(request.Test, progress_others, watch=partial(_comparison_watch, state, seq, signature, request, mine, low))


def _comparison_watch(state, seq: int, signature: Signature, request, mine, low) -> Watch:
    """The Watch of a comparison idle for a while: left by a mismatch, its request and arrays stay with
    the state (MPI may still write into them)."""
    return Watch(state, seq, signature, lambda error: state.abandoned.append((request, mine, low)), compare=False)


def agreement_described(state, call: tuple) -> str:
    """The wait in agree(), as a stall warning names it."""
    count, dtype, op, algorithm, collective = call
    name = collective.split()[0]
    return (f"{name} on rank {state.rank} of {state.comm.Get_name()} ({counted(count, 'element')} of "
            f"{dtype.name}, {op}, algorithm {algorithm}), in {_comparison(name)} of the ranks' arguments")


def _comparison(collective: str) -> str:
    """A rooted call (broadcast, reduce) compares its arguments by default; the others in check mode only."""
    return "the comparison" if COLLECTIVES[collective].rooted else "check mode's comparison"


def _code(text: str) -> int:
    return zlib.crc32(text.encode())
