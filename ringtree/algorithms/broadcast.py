"""Broadcast: every rank ends with the root's buffer. Ranks are counted from the root (position
(r - root) mod N), so that every algorithm is written for root 0.

binomial            a rank receives the whole message from its parent in the binomial tree and
                    sends it on to its children, largest subtree first: ⌈log2 N⌉ steps.
chain               position p receives from p-1 and sends to p+1; segmented, the segments
                    stream down the chain, and each rank sends the message once.
scatter_allgather   the root scatters one chunk per rank down the binomial tree, then a ring
                    allgather (van de Geijn) that skips the chunks a rank got in the scatter:
                    no rank sends more than about twice the message, where the binomial tree's
                    root sends it whole ⌈log2 N⌉ times.
"""

from __future__ import annotations

from ..schedule.ir import OUTPUT, Collective, Ref, Schedule, ScheduleBuilder, even_chunks, single_rank
from .tree import binomial_family


def binomial_broadcast(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("binomial", count, collective)
    b = ScheduleBuilder("binomial", nranks, rank, count, collective)
    at = _Positions(nranks, collective.root)
    parent, children = binomial_family(nranks, at.position(rank))
    everything = Ref(OUTPUT, 0, count)
    if parent is not None:
        b.recv(at.rank(parent), everything)
    for child in reversed(children):
        b.send(at.rank(child), everything)
    return b.build()


def chain_broadcast(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("chain", count, collective)
    b = ScheduleBuilder("chain", nranks, rank, count, collective)
    at = _Positions(nranks, collective.root)
    position = at.position(rank)
    everything = Ref(OUTPUT, 0, count)
    if position > 0:
        b.recv(at.rank(position - 1), everything)
    if position < nranks - 1:
        b.send(at.rank(position + 1), everything)
    return b.build()


def scatter_allgather_broadcast(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("scatter_allgather", count, collective)
    b = ScheduleBuilder("scatter_allgather", nranks, rank, count, collective)
    at = _Positions(nranks, collective.root)
    position = at.position(rank)
    chunks = even_chunks(count, nranks)

    def span(first: int, number: int) -> Ref:  # chunks first … first+number-1, in positions' order
        return Ref(OUTPUT, chunks[first][0], sum(size for _, size in chunks[first:first + number]))

    parent, children = binomial_family(nranks, position)
    if parent is not None:
        b.recv(at.rank(parent), span(position, subtree_size(nranks, position)))
    for child in reversed(children):
        b.send(at.rank(child), span(child, subtree_size(nranks, child)))

    def scattered_to(holder: int, chunk: int) -> bool:  # whether the scatter gave `holder` that chunk
        return 0 <= (chunk - holder) % nranks < subtree_size(nranks, holder)

    right, left = (position + 1) % nranks, (position - 1) % nranks
    for step in range(nranks - 1):
        passed, arriving = (position - step) % nranks, (position - step - 1) % nranks
        if not scattered_to(right, passed):
            b.send(at.rank(right), span(passed, 1))
        if not scattered_to(position, arriving):
            b.recv(at.rank(left), span(arriving, 1))
    return b.build()


def subtree_size(nranks: int, position: int) -> int:
    """How many positions the binomial subtree of `position` holds (it and the ones after it)."""
    return min(position & -position, nranks - position) if position else nranks


class _Positions:
    """Ranks counted from the root."""

    def __init__(self, nranks: int, root: int) -> None:
        self.nranks, self.root = nranks, root

    def position(self, rank: int) -> int:
        return (rank - self.root) % self.nranks

    def rank(self, position: int) -> int:
        return (position + self.root) % self.nranks
