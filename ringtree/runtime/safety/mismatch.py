"""Mismatches between ranks, caught by default: a call's signature travels with its messages.

Every plan has a Signature: its count, dtype, op, algorithm and segment as the
caller gave them, and a 16-bit code of them (dtype, op and algorithm exactly,
count and segment by a 4-bit hash; a program's own algorithm by one code, its name and
generator's origin in the hash). ringtree's messages carry the code in
their tag, under the call number, so messages of calls that differ never
match: a stepwise receive takes any tag from its peer and compares; the
engine's receives stay unmatched, and its idle waits look (`look`) for a
message of this call with another code. MPI's own allreduce runs on a
communicator of its plan's own, agreed on when the plan is made, so native
calls that differ never match either; a wait in one that makes no progress for
ANNOUNCE_SECONDS tells the other ranks, on the control communicator, which call
it is in, and a rank in the same call with another signature sees the difference.
So does the barrier before a tuning trial, and a wait in another collective than
allreduce: a rank in another call may wait for messages they send only later.

A rank that sees a difference tells every other rank (`everywhere`): a
notice on the private communicator, which ends a receive of any tag from it,
and its signature on the control communicator, which a waiting rank reads.
Each rank that learns of it does the same, then gathers the others'
signatures until each has raised (at most GATHER_SECONDS), taking in whatever
messages are still coming to it, and raises MismatchError naming the ranks and
what differs.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ...algorithms import REGISTRY, SHIPPED
from ...errors import MismatchError
from ...ops import ReduceOp
from ...schedule.collectives import COLLECTIVES
from ...tuning.online import NATIVE
from ...words import counted
from .backoff import Backoff

__all__ = ["Signature", "UNKNOWN", "signature", "TagLayout", "Evidence", "everywhere", "refused", "ranks_text",
           "differing", "seen", "keep_report", "tell", "CALL", "REFUSED", "GAVE_UP"]

CALL = 3  # the control communicator's tag for a rank's signature (reliability.py uses 1 and 2)
ANNOUNCE_SECONDS = 0.5  # a wait in MPI's own allreduce idle this long tells the others which call it is in
GATHER_SECONDS = 6.0  # how long a rank that raises waits for the others' signatures
# Calls whose reports a rank keeps: more than a program has in flight at once (calls waited for in any
# order look for theirs there).
REPORTS_KEPT = 1024
REFUSED = "refused its arguments: "  # how a rank's report says it refused a call (refusal.py)
GAVE_UP = "gave the call up: "  # how a rank's report says it timed out in a call (reliability.give_up)

_DTYPES = "?bBhHiIlLqQefdgFDG"
# ringtree's ops, then those only MPI's own allreduce computes (buffers.passes_through), as ops.op_name names them
_OPS = [op.value for op in ReduceOp] + ["MPI.MAXLOC", "MPI.MINLOC", "a user-defined MPI.Op"]
NO_OP = 15  # the op's code for a collective that reduces nothing: the last of 4 bits
ALGORITHM_BITS = 3  # of a signature's code: "auto" and every algorithm ringtree ships of a collective must fit
# ... beside the last code, which stands for any algorithm a program registered (ringtree.register_algorithm):
# its name and where its generator is defined go into the hashed part instead.
PROGRAMS = (1 << ALGORITHM_BITS) - 1
_ALGORITHMS = {name: ["auto", *sorted(algorithms)] for name, algorithms in SHIPPED.items()}
_ALGORITHMS["allreduce"] = ["auto", *SHIPPED["allreduce"]]
_MPI_ONLY = ["auto"]  # a collective that MPI's own alone computes (gather, scatter: runtime/engine/passed_through.py)
if len(_OPS) > NO_OP:
    raise ImportError(f"{len(_OPS)} ops; a signature codes at most {NO_OP} (runtime/safety/mismatch.py, NO_OP)")
for _name, _names in _ALGORITHMS.items():
    if len(_names) > PROGRAMS:
        raise ImportError(f"{_name} has {len(_names) - 1} algorithms; a signature codes auto and at most "
                          f"{PROGRAMS - 1}, and a program's own (runtime/safety/mismatch.py, ALGORITHM_BITS)")
_FIELDS = ("count", "dtype", "op", "algorithm", "segment", "collective", "root", "blocks")
_ROOT = 1 + _FIELDS.index("root")  # in a Signature


class Signature(NamedTuple):
    """A call as the ranks must agree on it, and its code in the tags."""

    code: int
    count: int
    dtype: str
    op: str | None
    algorithm: str
    segment: int | None
    collective: str = "allreduce"
    root: int | None = None  # broadcast and reduce
    blocks: tuple[int, ...] | None = None  # reduce-scatter and allgather: each rank's count

    def described(self) -> str:
        """'12 elements of float64, sum, algorithm ring' and the like, for a message."""
        what = (f"{counted(self.count, 'element')} of {self.dtype}" if self.count >= 0 else self.dtype) + (
            f", {self.op}" if self.op else "")  # a count below 0: not known (MPI's own checks it)
        return what + (f", root {self.root}" if self.root is not None else "") + f", algorithm {self.algorithm}"


UNKNOWN = Signature(-1, -1, "", "", "", None)  # a call stopped before its signature was known


def signature(count: int, dtype: np.dtype | str, op: str | None, algorithm: str, segment: int | None,
              collective: str = "allreduce", root: int | None = None,
              blocks: tuple[int, ...] | None = None) -> Signature:
    """dtype (5 bits), op (4), algorithm (ALGORITHM_BITS) exactly where known, the rest hashed (4): count and
    segment, and for other collectives than allreduce, which one, its root and its blocks. `dtype`: numpy's,
    or the name of an MPI datatype that numpy has none of (a call MPI's own allreduce runs)."""
    if isinstance(dtype, str):
        kind, name = 18 + _crc(dtype) % 14, dtype
    else:
        char, name = dtype.char if dtype.isnative else "", dtype.name
        kind = _DTYPES.index(char) if char and char in _DTYPES else 18 + _crc(dtype.str) % 14
    named = collective not in COLLECTIVES or COLLECTIVES[collective].named  # or MPI's own only (gather, ...)
    rest = f"{collective},{count},{segment},{root},{blocks}" if named else f"{count},{segment}"
    names = _ALGORITHMS.get(collective, _MPI_ONLY)
    if algorithm in names:
        coded = names.index(algorithm)
    elif algorithm == NATIVE:  # named by the call: coded as a program's own would be, without a generator
        coded, rest = PROGRAMS, f"{rest},{algorithm}"
    else:  # a program's own: which one, and where its generator is defined, as well as the code can say
        coded, rest = PROGRAMS, f"{rest},{algorithm},{REGISTRY[collective][algorithm].origin}"
    hashed = _crc(rest) & 15
    code = ((kind << 11) | ((NO_OP if op is None else _OPS.index(op)) << 7) | (coded << 4) | hashed)
    return Signature(code, count, name, op, algorithm, segment, collective, root, blocks)


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


class TagLayout(NamedTuple):
    """Tags on the private communicator: call number × codes + code for data, and above them a
    rank's notice of a mismatch in a call, notice + the call number modulo codes."""

    codes: int
    calls: int
    notice: int

    @classmethod
    def of(cls, tag_ub: int) -> TagLayout:
        bits = min(tag_ub + 1, 1 << 30).bit_length() - 1
        # The standard's smallest TAG_UB (32767) leaves 7 bits: the codes' low bits (count and
        # algorithm); dtype and op then go unseen.
        codes = 1 << min(16, bits - 8)
        calls = (1 << bits) // codes - 1
        return cls(codes, calls, calls * codes)

    def tag(self, seq: int, code: int) -> int:
        return (seq % self.calls) * self.codes + (code & (self.codes - 1))

    def notice_of(self, seq: int) -> int:
        return self.notice + seq % self.codes

    def stale(self, tag: int, seq: int) -> bool:
        """Whether `tag` is a notice of a call other than #seq: not this call's business."""
        return tag >= self.notice and tag != self.notice_of(seq)


class Evidence(Exception):
    """What a rank saw that shows a mismatch, before it tells the others (`everywhere`): a message
    from `source` with `tag`, or (tag None) what the text says."""

    def __init__(self, why: str, source: int | None = None, tag: int | None = None) -> None:
        super().__init__(why)
        self.source, self.tag = source, tag

    def why(self, layout: TagLayout) -> str:
        return str(self) if self.tag is None else seen(self.source, self.tag, layout)


def seen(source: int, tag: int, layout: TagLayout) -> str:
    if tag >= layout.notice:
        return f"rank {source} reports a mismatch"
    return f"a message from rank {source} is of a call with another signature"


def keep_report(state, source: int, theirs: tuple) -> tuple:
    """Keep a rank's signature (seq, Signature, raised, reason, threads bit set) for the message of an
    error in that call; the earliest call a rank gave up, for every call from it on (watch.given_up)."""
    if theirs[3].startswith(GAVE_UP) and (state.given_up is None or theirs[0] < state.given_up[0]):
        state.given_up = (theirs[0], source, theirs[3][len(GAVE_UP):])
    reports = state.reports
    if theirs[0] not in reports and len(reports) >= REPORTS_KEPT:  # the oldest calls' half: long ended
        for old in sorted(reports)[:REPORTS_KEPT // 2]:
            del reports[old]
    reports.setdefault(theirs[0], {})[source] = theirs
    if theirs[2]:
        state.raised.add(source)
    return theirs


def _take_reports(state, status: MPI.Status) -> bool:
    """Keep the other ranks' reports waiting on the control communicator (matched probes: another thread
    may take in at once); whether there were any."""
    took = False
    while (probed := state.control.improbe(MPI.ANY_SOURCE, CALL, status)) is not None:
        keep_report(state, status.Get_source(), probed.recv())
        took = True
    return took


def tell(state, seq: int, signature: Signature, raised: bool, reason: str = "") -> None:
    for rank in range(state.size):
        if rank != state.rank:
            state.send_control((seq, signature, raised, reason, bool(state.threads_bit)), rank, CALL)


def refused(state, seq: int, why: str) -> bool:
    """Tell every other rank that this one refused call #seq (a report, raised, with REFUSED + `why`), and
    wait until each has answered with its own report of that call: refused too, or raised on learning
    of it. Say whether every rank refused; if not, the communicator is unusable here too."""
    # Refusals count no call, so ranks that refuse calls in a row report them under one seq: the
    # signature's count says which refusal a report is of, and a rank that has gone on to the next
    # has refused this one (it heard from every rank first).
    mine = state.refusals
    tell(state, seq, UNKNOWN._replace(count=mine), True, REFUSED + why)
    others = [rank for rank in range(state.size) if rank != state.rank]
    status, backoff = MPI.Status(), Backoff()

    def answered(report) -> bool:
        return report is not None and report[2] and (not report[3].startswith(REFUSED) or report[1].count >= mine)

    while not all(answered(state.reports.get(seq, {}).get(rank)) for rank in others):
        _take_reports(state, status)
        backoff.empty()
    reports = state.reports[seq]
    answers = {rank: reports[rank] for rank in others}
    for rank in others:  # a report of the next refusal stays for it
        if not (answers[rank][3].startswith(REFUSED) and answers[rank][1].count > mine):
            del reports[rank]
    if not reports:
        del state.reports[seq]
    state.raised.difference_update(others)  # their reports of this call, not of a mismatch to come
    if all(answers[rank][3].startswith(REFUSED) for rank in others):
        state.refusals = mine + 1
        return True
    went_on = [rank for rank in others if not answers[rank][3].startswith(REFUSED)]
    state.broken = MismatchError(f"ringtree on rank {state.rank}: it refused its arguments to call #{seq}, which "
                                 f"{ranks_text(went_on)} made (and raised there)")
    return False


def everywhere(state, seq: int, signature: Signature, why: str, reason: str = "") -> MismatchError:
    """The MismatchError for call #seq, once every rank has been told of it: tell them (a NOTICE and
    this rank's signature, and `reason` where it is not a difference between calls), and gather
    their signatures until each has raised too, for at most GATHER_SECONDS, taking in the messages
    still coming meanwhile; mark the communicator unusable. Returned for the caller to raise."""
    with _TELLING:  # one thread tells and gathers; another that finds the mismatch too gets its error
        if not isinstance(state.broken, MismatchError):
            state.broken = _told(state, seq, signature, why, reason)
        return state.broken


_TELLING = threading.Lock()


def _told(state, seq: int, signature: Signature, why: str, reason: str) -> MismatchError:
    comm, me = state.comm, state.rank
    for rank in range(state.size):
        if rank != me:
            comm.Isend([b"", MPI.BYTE], rank, state.layout.notice_of(seq)).Free()
    tell(state, seq, signature, True, reason)
    others = state.size - 1
    status = MPI.Status()
    deadline = time.perf_counter() + GATHER_SECONDS
    reports = state.reports.setdefault(seq, {})
    backoff = Backoff()
    while len(state.raised) < others and time.perf_counter() < deadline:  # until every rank knows
        backoff.empty()
        if _take_reports(state, status):
            backoff.moved()
        message = comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        if message is not None:  # a message of this call, which a blocked sender waits to hand over
            backoff.moved()
            message.Recv([bytearray(status.Get_count(MPI.BYTE)), MPI.BYTE])
    return MismatchError(_message(state, seq, signature, why, reason, reports))


def _message(state, seq: int, signature: Signature, why: str, reason: str, reports: dict) -> str:
    reasons = {state.rank: reason} if reason else {}
    reasons.update({rank: report[3] for calls in state.reports.values() for rank, report in calls.items() if report[3]})
    if reasons:
        by_reason: dict = {}
        for rank in sorted(reasons):
            by_reason.setdefault(reasons[rank], []).append(rank)
        return (f"ringtree {signature.collective} on rank {state.rank} of {state.comm.Get_name()}: "
                + "; ".join(f"on {ranks_text(ranks)}, {text}" for text, ranks in by_reason.items()))
    everyone = {state.rank: signature, **{rank: report[1] for rank, report in reports.items() if report[0] == seq}}
    differences = []
    for k, field in enumerate(_FIELDS, start=1):
        # A root of None is every root (a call that shows the ranks' roots, roots.py): none to differ from.
        differences += differing(field, {rank: everyone[rank][k] for rank in sorted(everyone)
                                         if k != _ROOT or everyone[rank][k] is not None})
    shared = {state.rank: bool(state.threads_bit), **{rank: report[4] for rank, report in reports.items()
                                                       if report[0] == seq}}
    if len(set(shared.values())) > 1:
        differences.append("a call of another thread on it among the last calls: " + "; ".join(
            f"{'yes' if other else 'no'} on {ranks_text([r for r in sorted(shared) if shared[r] is other])}"
            for other in (True, False)))
    silent = [rank for rank in range(state.size) if rank not in everyone]
    if silent:
        differences.append(f"no signature from {ranks_text(silent)} within {GATHER_SECONDS:g} s")
    return (f"ringtree {signature.collective} on rank {state.rank}: the ranks of {state.comm.Get_name()} "
            f"disagree at call #{seq} (here {signature.described()}): "
            + (" | ".join(differences) or why) + f" ({why})")


def differing(field: str, by_rank: dict) -> list[str]:
    """["field: 'a' on rank 0; 'b' on ranks 1-2"] where the ranks of `by_rank` (rank -> value, in rank
    order) hold more than one value of `field`; else []."""
    holders: dict = {}
    for rank, value in by_rank.items():
        holders.setdefault(value, []).append(rank)
    if len(holders) < 2:
        return []
    return [f"{field}: " + "; ".join(f"{value!r} on {ranks_text(ranks)}" for value, ranks in holders.items())]


def ranks_text(ranks: list[int]) -> str:
    """'rank 3' or 'ranks 0-2, 5'."""
    spans, start = [], ranks[0]
    for previous, current in zip(ranks, ranks[1:] + [None]):
        if current != previous + 1:
            spans.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = current
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(spans)
