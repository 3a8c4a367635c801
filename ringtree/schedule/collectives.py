"""The collectives: one entry each, holding what differs between them (rule 6 of docs/design.md).

An entry is data and small pure functions of an `ir.Collective` (its name, counts and root): which
arguments it takes (blocks, a count matrix, a root, an INPUT), its buffers' sizes (`extents`), what
its OUTPUT holds at the end (`promised`, the verifier's postcondition), and the names of MPI's own
counterpart (mpi4py's methods). Code outside this registry asks the entry, never the name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["CollectiveKind", "Promise", "COLLECTIVES", "kind_of"]


class Promise(NamedTuple):
    """What `size` elements of a rank's OUTPUT from `offset` on hold at the end: the inputs of every
    rank added once (`source` None) or rank `source`'s input alone, elements `first` on of the
    inputs (of the blocks laid end to end where an entry's `first_input` says so)."""

    offset: int
    size: int
    source: int | None
    first: int


@dataclass(frozen=True, slots=True)
class CollectiveKind:
    """One collective: what sets it apart from the others."""

    name: str
    mpi: str  # MPI's own counterpart, as mpi4py names its blocking method (Allreduce, Bcast, ...)
    # (INPUT's size, OUTPUT's size, where INPUT lies in OUTPUT in place or None) of (collective, rank, count)
    extents: Callable
    # what a rank's OUTPUT holds at the end: Promises of (collective, rank, OUTPUT's size)
    promised: Callable
    reduces: bool  # it combines the ranks' inputs with an op
    blocks: bool = False  # its counts give each rank's block
    matrix: bool = False  # its counts may be an N×N matrix (what each rank sends each), not N alike
    rooted: bool = False  # it takes a root
    has_input: bool = True  # a broadcast has none: its data is the root's OUTPUT
    # which element of the inputs (blocks laid end to end) rank's INPUT starts with, of (collective, rank)
    first_input: Callable = lambda collective, rank: 0
    # busbw / algbw, as nccl-tests has it: what each rank's links carry of the size, at best, of nranks
    bus_factor: Callable = lambda nranks: 1.0
    # Tuned by the α-β-γ model fitted to its algorithms, per segment, and online (others: a table of their
    # whole grid)
    modelled: bool = False
    # bench and tune time it at any whole number of elements, bench in place or not and on CuPy arrays
    # too (others: a whole number of elements per rank, numpy arrays out of place)
    whole_sizes: bool = False
    bench_algorithms: tuple[str, ...] | None = None  # bench's default (None: every algorithm of it), with auto, native
    # which of the public function's arrays a blocking call returns, and its runs are kept by (recvbuf;
    # a broadcast's buf)
    returned_argument: int = 1
    # messages, logs and signature codes name it (allreduce's, the first collective's, leave it out)
    named: bool = True
    given_collective: bool = True  # its generators take (nranks, rank, count, collective), not only the first three
    node_aware: bool = False  # its generators may take a topology (hierarchical)

    @property
    def given(self) -> str:
        """The buffer that holds the data a call is given: INPUT, or a broadcast's OUTPUT (ir's names)."""
        return "input" if self.has_input else "output"

    @property
    def nonblocking(self) -> str:
        """mpi4py's nonblocking method of MPI's own counterpart (Iallreduce, Ibcast, ...)."""
        return "I" + self.mpi.lower()

    @property
    def persistent(self) -> str:
        """mpi4py's persistent method of MPI's own counterpart (Allreduce_init, Bcast_init, ...)."""
        return self.mpi + "_init"


def _everywhere(collective, rank: int, size: int) -> tuple[Promise, ...]:
    return (Promise(0, size, None, 0),)


def _reduce_scatter_promised(collective, rank: int, size: int) -> tuple[Promise, ...]:
    return (Promise(0, size, None, collective.displacement(rank)),)


def _allgather_promised(collective, rank: int, size: int) -> tuple[Promise, ...]:
    starts = itertools.accumulate(collective.counts, initial=0)
    return tuple(Promise(start, block, source, start) for source, (start, block) in
                 enumerate(zip(starts, collective.counts)))


def _alltoall_promised(collective, rank: int, size: int) -> tuple[Promise, ...]:
    """Block s: element j of rank s's block for this rank."""
    _, received = collective.exchanged(rank)
    return tuple(Promise(offset, block, source, collective.exchanged(source)[0][rank][0])
                 for source, (offset, block) in enumerate(received))


def _broadcast_promised(collective, rank: int, size: int) -> tuple[Promise, ...]:
    return (Promise(0, size, collective.root, 0),)


def _alltoall_extents(collective, rank: int, count: int) -> tuple[int, int, int | None]:
    """In place by way of a copy of the input (collective_args.py)."""
    sent, received = collective.exchanged(rank)
    return sum(size for _, size in sent), sum(size for _, size in received), None


def _shared(nranks: int) -> float:
    """A collective whose ranks each send or receive all but their own share."""
    return (nranks - 1) / nranks


_ENTRIES = (
    CollectiveKind("allreduce", "Allreduce", lambda collective, rank, count: (count, count, 0), _everywhere,
                   reduces=True, bus_factor=lambda nranks: 2 * (nranks - 1) / nranks, modelled=True, whole_sizes=True,
                   bench_algorithms=("ring", "tree"), named=False, given_collective=False, node_aware=True),
    CollectiveKind("reduce_scatter", "Reduce_scatter",
                   lambda collective, rank, count: (count, collective.counts[rank], None),
                   _reduce_scatter_promised, reduces=True, blocks=True, bus_factor=_shared),
    CollectiveKind("allgather", "Allgather",
                   lambda collective, rank, count: (collective.counts[rank], count, collective.displacement(rank)),
                   _allgather_promised, reduces=False, blocks=True, bus_factor=_shared,
                   first_input=lambda collective, rank: collective.displacement(rank)),
    CollectiveKind("broadcast", "Bcast", lambda collective, rank, count: (0, count, None), _broadcast_promised,
                   reduces=False, rooted=True, has_input=False, returned_argument=0),
    CollectiveKind("reduce", "Reduce",
                   lambda collective, rank, count: (count, count, 0) if rank == collective.root else (count, 0, None),
                   _everywhere, reduces=True, rooted=True),
    CollectiveKind("alltoall", "Alltoall", _alltoall_extents, _alltoall_promised, reduces=False, blocks=True,
                   matrix=True, bus_factor=_shared),
)
COLLECTIVES: dict[str, CollectiveKind] = {kind.name: kind for kind in _ENTRIES}  # iterated: the names


def kind_of(name: str) -> CollectiveKind:
    """The entry of collective `name`; ValueError naming the known ones."""
    kind = COLLECTIVES.get(name)
    if kind is None:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")
    return kind
