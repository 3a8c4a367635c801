"""The schedule IR and its builder: one rank's part of a collective as plain, immutable data.

A schedule lists operations on regions of named buffers. Each op names the
earlier ops of the same rank it depends on; across ranks, order comes only from
a SEND matching a RECV between the same pair of ranks, in posting order (MPI's
non-overtaking rule). The engine, the verifier and every other consumer read
this data; nothing here knows about MPI or arrays.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

INPUT = "input"
OUTPUT = "output"


class OpKind(IntEnum):
    """An op's kind. Integers, so that the engine and the simulator keep kinds in flat arrays; the
    ones from REDUCE on run on the rank's processor, the others are messages."""

    SEND = 0  # send srcs[0] to peer
    RECV = 1  # receive from peer into dst
    REDUCE = 2  # dst <- srcs[0] (+) srcs[1], in that operand order
    COPY = 3  # dst <- srcs[0]

    def __str__(self) -> str:
        return self.name.lower()


class Ref(NamedTuple):
    """A region of a buffer, in elements. (Ref and Op are named tuples: a 1024-rank ring
    makes millions of them, and a tuple is built several times faster than a frozen dataclass.)"""

    buffer: str
    offset: int
    count: int

    @property
    def end(self) -> int:
        return self.offset + self.count

    def __str__(self) -> str:
        return f"{self.buffer}[{self.offset}:{self.end}]"


class Op(NamedTuple):
    kind: OpKind
    dst: Ref | None = None  # region written (RECV, REDUCE, COPY)
    srcs: tuple[Ref, ...] = ()  # regions read (SEND, COPY: one; REDUCE: left and right operand)
    peer: int | None = None  # SEND and RECV only
    deps: tuple[int, ...] = ()  # indices of earlier ops of this rank

    @property
    def src(self) -> Ref | None:
        return self.srcs[0] if self.srcs else None

    @property
    def regions(self) -> tuple[Ref, ...]:
        return self.srcs + ((self.dst,) if self.dst is not None else ())

    def __str__(self) -> str:
        if self.kind is OpKind.SEND:
            return f"send {self.src} to {self.peer}"
        if self.kind is OpKind.RECV:
            return f"recv {self.dst} from {self.peer}"
        if self.kind is OpKind.REDUCE:
            return f"reduce {self.dst} <- {self.srcs[0]} (+) {self.srcs[1]}"
        return f"copy {self.dst} <- {self.src}"


@dataclass(frozen=True, slots=True)
class Schedule:
    """One rank's ops for one collective over `count` elements.

    `scratch` declares the scratch buffers (name, size in elements) that ops
    may use besides INPUT and OUTPUT, both of size `count`.
    """

    algorithm: str
    nranks: int
    rank: int
    count: int
    scratch: tuple[tuple[str, int], ...]
    ops: tuple[Op, ...]

    def buffer_sizes(self) -> dict[str, int]:
        return {INPUT: self.count, OUTPUT: self.count, **dict(self.scratch)}


class _Hazards:
    """The last writer, and the readers since, of each element range of one buffer.

    Ranges split where an access begins or ends. `ranges` maps each range's
    first element to [end, writer, readers]; `starts` lists the first elements
    in order. An access to exactly one existing range, the usual case, costs
    one dictionary lookup.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.starts = [0]
        self.ranges: dict[int, list] = {0: [size, None, []]}

    def access(self, offset: int, end: int, op: int, write: bool, deps: set[int]) -> bool:
        """Add to `deps` the ops that `op` must follow to read or write [offset, end), and record
        the access; False, with nothing recorded, if the region is out of bounds."""
        found = self.ranges.get(offset)
        if found is not None and found[0] == end:
            covered = (found,)
        else:
            if offset < 0 or end > self.size:
                return False
            self._split(offset)
            self._split(end)
            first = bisect.bisect_left(self.starts, offset)
            covered = [self.ranges[start] for start in self.starts[first:bisect.bisect_left(self.starts, end, first)]]
        for state in covered:
            if state[1] is not None:
                deps.add(state[1])
            if write:
                deps.update(state[2])
                state[1] = op
                state[2] = []
            else:
                state[2].append(op)
        return True

    def _split(self, at: int) -> None:
        """Make a range start at element `at` (unless `at` is the end of the buffer)."""
        if at in self.ranges:
            return
        i = bisect.bisect_right(self.starts, at) - 1
        state = self.ranges[self.starts[i]]
        if at >= state[0]:
            return
        self.ranges[at] = [state[0], state[1], list(state[2])]
        state[0] = at
        self.starts.insert(i + 1, at)


class ScheduleBuilder:
    """Builds a schedule from ops listed in a valid sequential order.

    Dependencies are derived from the regions each op reads and writes (read
    after write, write after read, write after write), so a generator lists
    what happens and the builder works out what may overlap. INPUT is tracked
    as if it were OUTPUT, so every schedule is also correct in place, when the
    two are the same memory. Ops on empty regions are dropped.
    """

    def __init__(self, algorithm: str, nranks: int, rank: int, count: int) -> None:
        if nranks < 1 or not 0 <= rank < nranks or count < 0:
            raise ValueError(f"bad schedule shape: nranks={nranks} rank={rank} count={count}")
        self.algorithm, self.nranks, self.rank, self.count = algorithm, nranks, rank, count
        self._sizes = {INPUT: count, OUTPUT: count}
        self._scratch: list[tuple[str, int]] = []
        output = _Hazards(count)
        self._hazards = {OUTPUT: output, INPUT: output}  # as if in place
        self._ops: list[Op] = []

    def scratch(self, name: str, count: int) -> Ref:
        """Declare a scratch buffer and return a ref to all of it."""
        if name in self._sizes:
            raise ValueError(f"buffer {name!r} declared twice")
        self._sizes[name] = count
        self._scratch.append((name, count))
        self._hazards[name] = _Hazards(count)
        return Ref(name, 0, count)

    def send(self, peer: int, src: Ref) -> None:
        self._append(OpKind.SEND, None, (src,), self._peer(peer))

    def recv(self, peer: int, dst: Ref) -> None:
        self._append(OpKind.RECV, dst, (), self._peer(peer))

    def reduce(self, dst: Ref, left: Ref, right: Ref) -> None:
        """dst <- left (+) right; dst may be one of the operands."""
        self._append(OpKind.REDUCE, dst, (left, right), None)

    def copy(self, dst: Ref, src: Ref) -> None:
        self._append(OpKind.COPY, dst, (src,), None)

    def add(self, op: Op) -> None:
        """Append `op` (its deps are ignored and derived anew)."""
        self._append(op.kind, op.dst, op.srcs, op.peer)

    def build(self) -> Schedule:
        return Schedule(self.algorithm, self.nranks, self.rank, self.count,
                        tuple(self._scratch), tuple(self._ops))

    def _peer(self, peer: int) -> int:
        if not 0 <= peer < self.nranks or peer == self.rank:
            raise ValueError(f"rank {self.rank} of {self.nranks}: bad peer {peer}")
        return peer

    def _append(self, kind: OpKind, dst: Ref | None, srcs: tuple[Ref, ...], peer: int | None) -> None:
        # The hot loop of every generator: a 1024-rank ring lists five million ops.
        if dst is None:
            count = srcs[0].count
        else:
            count = dst.count
            for ref in srcs:
                if ref.count != count:
                    raise ValueError(f"rank {self.rank}: {Op(kind, dst, srcs, peer)} has regions of different sizes")
        if count == 0:
            return
        index = len(self._ops)
        deps: set[int] = set()
        hazards = self._hazards
        regions, writes = (srcs, _READS[len(srcs)]) if dst is None else (srcs + (dst,), _READS[len(srcs)] + (True,))
        for ref, write in zip(regions, writes):
            tracker = hazards.get(ref.buffer)
            if tracker is None or not tracker.access(ref.offset, ref.offset + count, index, write, deps):
                raise ValueError(f"rank {self.rank}: {Op(kind, dst, srcs, peer)} is out of bounds "
                                 f"(the builder is not to be used after this error)")
        deps.discard(index)
        self._ops.append(_new_tuple(Op, (kind, dst, srcs, peer, tuple(sorted(deps)))))


_READS = ((), (False,), (False, False))
_new_tuple = tuple.__new__  # builds an Op without NamedTuple's slower Python-level __new__


def single_rank(algorithm: str, count: int) -> Schedule:
    """An allreduce on one rank: the output is a copy of the input."""
    b = ScheduleBuilder(algorithm, 1, 0, count)
    b.copy(Ref(OUTPUT, 0, count), Ref(INPUT, 0, count))
    return b.build()


def even_chunks(count: int, parts: int) -> list[tuple[int, int]]:
    """Split range(count) into `parts` contiguous (offset, size) chunks differing by at most one."""
    bounds = [i * count // parts for i in range(parts + 1)]
    return [(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]
