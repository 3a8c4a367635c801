"""The schedule IR and its builder: one rank's part of a collective as plain, immutable data.

A schedule lists operations on regions of named buffers. Each op names the
earlier ops of the same rank it depends on; across ranks, order comes only from
a SEND matching a RECV between the same pair of ranks, in posting order (MPI's
non-overtaking rule). The engine, the verifier and every other consumer read
this data; nothing here knows about MPI or arrays.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from .collectives import COLLECTIVES, CollectiveKind, kind_of

INPUT = "input"
OUTPUT = "output"
KEPT = "kept "  # a scratch buffer so named keeps data for long (partial sums); segmenting leaves it whole
POOL = "/"  # scratch named "pool/name": segmenting gives each pool a window of slots of its own


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


class Collective(NamedTuple):
    """Which collective a schedule computes, as every rank's call gives it.

    allreduce       every rank's OUTPUT: the total of every rank's INPUT
    reduce_scatter  rank r's OUTPUT: block r of the total (INPUT holds every block)
    allgather       every rank's OUTPUT: every rank's INPUT, block r from rank r
    broadcast       every rank's OUTPUT: the root's OUTPUT as it was (there is no INPUT)
    reduce          the root's OUTPUT: the total (the others have no OUTPUT)
    alltoall        rank r's OUTPUT: block r of every rank's INPUT, block s from rank s

    Blocks lie in rank order, block r of `counts[r]` elements. An alltoall's counts are N alike, or its
    N×N matrix row by row (`counts[s * N + d]`: what rank s sends rank d), of `count` elements in all.
    """

    name: str = "allreduce"
    counts: tuple[int, ...] = ()  # elements of each rank's block: reduce_scatter, allgather and alltoall
    root: int = 0  # broadcast and reduce

    @property
    def kind(self) -> CollectiveKind:
        """This collective's entry in the registry (collectives.COLLECTIVES)."""
        return COLLECTIVES[self.name]

    def check(self, nranks: int, count: int) -> None:
        kind = kind_of(self.name)
        given = nranks * nranks if kind.matrix and len(self.counts) == nranks * nranks else nranks
        if kind.blocks and (len(self.counts) != given or sum(self.counts) != count or min(self.counts, default=0) < 0):
            raise ValueError(f"{self.name}: counts {self.counts} must be {nranks} counts >= 0 adding up to {count}"
                             + (f", or {nranks}×{nranks}" if kind.matrix else ""))
        if kind.matrix and (given == nranks) != self.alike():
            raise ValueError(f"{self.name}: counts {self.counts} must be {nranks} alike, or a {nranks}×{nranks} "
                             "matrix of what each rank sends each whose blocks are not all alike")
        if not 0 <= self.root < nranks:
            raise ValueError(f"{self.name}: root {self.root} is not a rank of {nranks}")

    def displacement(self, rank: int) -> int:
        """Where block `rank` starts."""
        return sum(self.counts[:rank])

    def extents(self, rank: int, count: int) -> tuple[int, int, int | None]:
        """(INPUT's size, OUTPUT's size, where INPUT lies in OUTPUT when the call is in place, or None
        where an in-place call is not this schedule's concern) for `rank`."""
        return self.kind.extents(self, rank, count)

    def exchanged(self, rank: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """An alltoall's blocks at `rank`: (offset, size) in INPUT of the one for each rank, and in OUTPUT
        of the one from each rank."""
        if self.alike():
            placed = blocks(self.counts)
            return placed, placed
        nranks = math.isqrt(len(self.counts))
        return (blocks(self.counts[rank * nranks:(rank + 1) * nranks]),
                blocks(self.counts[rank::nranks]))

    def alike(self) -> bool:
        """Whether an alltoall's blocks are all one size: its counts are N alike, not a matrix."""
        return self.counts.count(self.counts[0]) == len(self.counts) if self.counts else True


ALLREDUCE = Collective()


@dataclass(frozen=True, slots=True)
class Schedule:
    """One rank's ops for one collective over `count` elements (all blocks together).

    `scratch` declares the scratch buffers (name, size in elements) that ops
    may use besides INPUT and OUTPUT, whose sizes the collective gives.
    """

    algorithm: str
    nranks: int
    rank: int
    count: int
    scratch: tuple[tuple[str, int], ...]
    ops: tuple[Op, ...]
    collective: Collective = ALLREDUCE

    def buffer_sizes(self) -> dict[str, int]:
        inputs, outputs, _ = self.collective.extents(self.rank, self.count)
        return {INPUT: inputs, OUTPUT: outputs, **dict(self.scratch)}

    @property
    def input_at(self) -> int | None:
        """Where INPUT lies in OUTPUT when the call is in place (None: never in place)."""
        return self.collective.extents(self.rank, self.count)[2]


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


class _Shifted:
    """INPUT's accesses, tracked where INPUT lies in OUTPUT when the call is in place."""

    def __init__(self, output: _Hazards, at: int, size: int) -> None:
        self.output, self.at, self.size = output, at, size

    def access(self, offset: int, end: int, op: int, write: bool, deps: set[int]) -> bool:
        if offset < 0 or end > self.size:
            return False
        return self.output.access(offset + self.at, end + self.at, op, write, deps)


class ScheduleBuilder:
    """Builds a schedule from ops listed in a valid sequential order.

    Dependencies are derived from the regions each op reads and writes (read
    after write, write after read, write after write), so a generator lists
    what happens and the builder works out what may overlap. INPUT is tracked
    as if it were the part of OUTPUT it is when the call is in place, so every
    schedule is also correct in place. Ops on empty regions are dropped.
    """

    def __init__(self, algorithm: str, nranks: int, rank: int, count: int,
                 collective: Collective = ALLREDUCE) -> None:
        if nranks < 1 or not 0 <= rank < nranks or count < 0:
            raise ValueError(f"bad schedule shape: nranks={nranks} rank={rank} count={count}")
        collective.check(nranks, count)
        self.algorithm, self.nranks, self.rank, self.count = algorithm, nranks, rank, count
        self.collective = collective
        inputs, outputs, input_at = collective.extents(rank, count)
        self._sizes = {INPUT: inputs, OUTPUT: outputs}
        self._scratch: list[tuple[str, int]] = []
        output = _Hazards(outputs)
        if input_at is None:
            self._hazards = {OUTPUT: output, INPUT: _Hazards(inputs)}
        elif input_at == 0 and inputs == outputs:
            self._hazards = {OUTPUT: output, INPUT: output}  # as if in place
        else:
            self._hazards = {OUTPUT: output, INPUT: _Shifted(output, input_at, inputs)}
        self._ops: list[Op] = []

    @classmethod
    def like(cls, schedule: Schedule) -> ScheduleBuilder:
        """A builder for another schedule of the same rank and collective (a pass's output)."""
        return cls(schedule.algorithm, schedule.nranks, schedule.rank, schedule.count, schedule.collective)

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
                        tuple(self._scratch), tuple(self._ops), self.collective)

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


def single_rank(algorithm: str, count: int, collective: Collective = ALLREDUCE) -> Schedule:
    """A collective on one rank: the output is a copy of the input (a broadcast has nothing to do)."""
    b = ScheduleBuilder(algorithm, 1, 0, count, collective)
    if collective.kind.has_input:
        b.copy(Ref(OUTPUT, 0, count), Ref(INPUT, 0, count))
    return b.build()


def even_chunks(count: int, parts: int) -> list[tuple[int, int]]:
    """Split range(count) into `parts` contiguous (offset, size) chunks differing by at most one."""
    bounds = [i * count // parts for i in range(parts + 1)]
    return [(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]


def blocks(counts: tuple[int, ...]) -> list[tuple[int, int]]:
    """The (offset, size) of each block of `counts`, in order."""
    return [(offset, size) for offset, size in zip(itertools.accumulate(counts, initial=0), counts)]
