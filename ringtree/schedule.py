"""The schedule IR: one rank's part of a collective as plain, immutable data.

A schedule lists operations on regions of named buffers. Each op names the
earlier ops of the same rank it depends on; across ranks, order comes only from
a SEND matching a RECV between the same pair of ranks, in posting order (MPI's
non-overtaking rule). The engine, the verifier and every other consumer read
this data; nothing here knows about MPI or arrays.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import Enum

INPUT = "input"
OUTPUT = "output"


class OpKind(Enum):
    SEND = "send"  # send srcs[0] to peer
    RECV = "recv"  # receive from peer into dst
    REDUCE = "reduce"  # dst <- srcs[0] (+) srcs[1], in that operand order
    COPY = "copy"  # dst <- srcs[0]


@dataclass(frozen=True, slots=True)
class Ref:
    """A region of a buffer, in elements."""

    buffer: str
    offset: int
    count: int

    @property
    def end(self) -> int:
        return self.offset + self.count

    def __str__(self) -> str:
        return f"{self.buffer}[{self.offset}:{self.end}]"


@dataclass(frozen=True, slots=True)
class Op:
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
    """Last writer and readers since, per element range of one buffer."""

    def __init__(self, size: int) -> None:
        self.starts = [0]
        self.writer: list[int | None] = [None]
        self.readers: list[list[int]] = [[]]
        self.size = size

    def _split(self, at: int) -> int:
        i = bisect.bisect_right(self.starts, at) - 1
        if self.starts[i] == at:
            return i
        self.starts.insert(i + 1, at)
        self.writer.insert(i + 1, self.writer[i])
        self.readers.insert(i + 1, list(self.readers[i]))
        return i + 1

    def _span(self, ref: Ref) -> range:
        first = self._split(ref.offset)
        if ref.end < self.size:
            self._split(ref.end)
        last = bisect.bisect_left(self.starts, ref.end)
        return range(first, last)

    def deps(self, ref: Ref, write: bool) -> set[int]:
        found: set[int] = set()
        for i in self._span(ref):
            if self.writer[i] is not None:
                found.add(self.writer[i])
            if write:
                found.update(self.readers[i])
        return found

    def record(self, ref: Ref, op: int, write: bool) -> None:
        for i in self._span(ref):
            if write:
                self.writer[i] = op
                self.readers[i] = []
            else:
                self.readers[i].append(op)


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
        self._hazards = {OUTPUT: _Hazards(count)}
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
        self.add(Op(OpKind.SEND, srcs=(src,), peer=self._peer(peer)))

    def recv(self, peer: int, dst: Ref) -> None:
        self.add(Op(OpKind.RECV, dst=dst, peer=self._peer(peer)))

    def reduce(self, dst: Ref, left: Ref, right: Ref) -> None:
        """dst <- left (+) right; dst may be one of the operands."""
        self.add(Op(OpKind.REDUCE, dst=dst, srcs=(left, right)))

    def copy(self, dst: Ref, src: Ref) -> None:
        self.add(Op(OpKind.COPY, dst=dst, srcs=(src,)))

    def build(self) -> Schedule:
        return Schedule(self.algorithm, self.nranks, self.rank, self.count,
                        tuple(self._scratch), tuple(self._ops))

    def _peer(self, peer: int) -> int:
        if not 0 <= peer < self.nranks or peer == self.rank:
            raise ValueError(f"rank {self.rank} of {self.nranks}: bad peer {peer}")
        return peer

    def add(self, op: Op) -> None:
        """Append `op` (its deps are ignored and derived anew)."""
        regions = [(ref, False) for ref in op.srcs] + ([(op.dst, True)] if op.dst is not None else [])
        if len({ref.count for ref, _ in regions}) != 1:
            raise ValueError(f"rank {self.rank}: {op} has regions of different sizes")
        if regions[0][0].count == 0:
            return
        for ref, _ in regions:
            if ref.buffer not in self._sizes or ref.offset < 0 or ref.end > self._sizes[ref.buffer]:
                raise ValueError(f"rank {self.rank}: {op} is out of bounds")
        index = len(self._ops)
        deps: set[int] = set()
        for ref, write in regions:
            deps |= self._tracker(ref).deps(ref, write)
        for ref, write in regions:
            self._tracker(ref).record(ref, index, write)
        self._ops.append(Op(op.kind, op.dst, op.srcs, op.peer, tuple(sorted(deps))))

    def _tracker(self, ref: Ref) -> _Hazards:
        return self._hazards[OUTPUT if ref.buffer == INPUT else ref.buffer]


def single_rank(algorithm: str, count: int) -> Schedule:
    """An allreduce on one rank: the output is a copy of the input."""
    b = ScheduleBuilder(algorithm, 1, 0, count)
    b.copy(Ref(OUTPUT, 0, count), Ref(INPUT, 0, count))
    return b.build()


def blocking_steps(schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """The ops in their listed order, as steps for a runner that blocks on each.

    A send and a receive listed next to each other, neither depending on the
    other, form one step (both in flight together, as MPI_Sendrecv); every
    other op is a step of its own. Every generator lists its ops so that this
    order cannot deadlock; the verifier checks it.
    """
    ops, steps, i = schedule.ops, [], 0
    while i < len(ops):
        op = ops[i]
        following = ops[i + 1] if i + 1 < len(ops) else None
        if (following is not None and op.peer is not None and following.peer is not None
                and op.kind is not following.kind and i not in following.deps):
            steps.append((i, i + 1))
            i += 2
        else:
            steps.append((i,))
            i += 1
    return tuple(steps)


def even_chunks(count: int, parts: int) -> list[tuple[int, int]]:
    """Split range(count) into `parts` contiguous (offset, size) chunks differing by at most one."""
    bounds = [i * count // parts for i in range(parts + 1)]
    return [(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]



@dataclass(frozen=True, slots=True)
class Dataflow:
    """How one rank's ops release each other, for whatever runs a schedule.

    An op may run once its deps have finished and, for a message, once the
    previous message on its channel (same kind, same peer) has been posted:
    posting in schedule order per channel is what makes matching by order work.
    """

    dependents: tuple[tuple[int, ...], ...]  # ops whose deps include this one
    channel_next: tuple[int, ...]  # the next message on the same channel, or -1
    initial_pending: tuple[int, ...]  # deps, plus one for an earlier message on the same channel


def dataflow(schedule: Schedule) -> Dataflow:
    n = len(schedule.ops)
    dependents: list[list[int]] = [[] for _ in range(n)]
    channel_next = [-1] * n
    pending = [len(op.deps) for op in schedule.ops]
    last_on_channel: dict[tuple[OpKind, int], int] = {}
    for i, op in enumerate(schedule.ops):
        for d in op.deps:
            dependents[d].append(i)
        if op.peer is not None:
            previous = last_on_channel.get((op.kind, op.peer))
            if previous is not None:
                channel_next[previous] = i
                pending[i] += 1
            last_on_channel[(op.kind, op.peer)] = i
    return Dataflow(tuple(map(tuple, dependents)), tuple(channel_next), tuple(pending))
