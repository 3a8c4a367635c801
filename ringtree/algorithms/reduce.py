"""Reduce: the root ends with the total of every rank's input. Ranks are counted from the root
(position (r - root) mod N), so that every algorithm is written for root 0.

binomial     a rank adds its children's partial sums to its input, smallest subtree first,
             and sends the total to its parent: ⌈log2 N⌉ steps, each carrying the whole message.
rabenseifner a recursive-halving reduce-scatter leaves each of P = 2^⌊log2 N⌋ positions the
             total of one chunk, and a binomial gather brings the chunks to the root: each
             rank sends about (P-1)/P of the message for the reduce-scatter and at most as
             much again for the gather, in 2·log2 P messages. When N is not a power of two,
             each of the first N - P odd positions first hands its input to the even one below.
"""

from __future__ import annotations

from ..schedule.ir import INPUT, KEPT, OUTPUT, Collective, Ref, Schedule, ScheduleBuilder, even_chunks, single_rank
from .broadcast import subtree_size
from .reduce_scatter import Folding, halving_rounds
from .tree import binomial_family


def binomial_reduce(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("binomial", count, collective)
    b = ScheduleBuilder("binomial", nranks, rank, count, collective)
    to_rank = _ranks_from(nranks, collective.root)
    parent, children = binomial_family(nranks, (rank - collective.root) % nranks)
    total = Ref(OUTPUT if parent is None else KEPT + "partials", 0, count)
    if parent is not None and children:
        b.scratch(total.buffer, count)
    incoming = b.scratch("incoming", min(len(children), 2) * count)
    partial = Ref(INPUT, 0, count)
    for i, child in enumerate(children):
        slot = Ref(incoming.buffer, (i % 2) * count, count)
        b.recv(to_rank(child), slot)
        b.reduce(total, partial, slot)
        partial = total
    if parent is None:
        if not children:
            b.copy(total, partial)
    else:
        b.send(to_rank(parent), partial)
    return b.build()


def rabenseifner_reduce(nranks: int, rank: int, count: int, collective: Collective) -> Schedule:
    if nranks == 1:
        return single_rank("rabenseifner", count, collective)
    b = ScheduleBuilder("rabenseifner", nranks, rank, count, collective)
    to_rank = _ranks_from(nranks, collective.root)
    place = (rank - collective.root) % nranks  # the position counted from the root, before folding
    fold = Folding(nranks)
    if fold.sits_out(place):
        b.send(to_rank(place - 1), Ref(INPUT, 0, count))
        return b.build()
    chunks = even_chunks(count, fold.positions)

    def start(p: int) -> int:
        return chunks[p][0] if p < fold.positions else count

    partials = Ref(OUTPUT if place == 0 else KEPT + "partials", 0, count)
    if place:
        b.scratch(partials.buffer, count)
    source = INPUT
    if fold.takes_in(place):
        slot = b.scratch("folded", count)
        b.recv(to_rank(place + 1), slot)
        b.reduce(partials, Ref(INPUT, 0, count), slot)
        source = partials.buffer
    position = fold.position(place)
    halving_rounds(b, position, fold.positions, lambda p: to_rank(fold.rank_at(p)), start, source, partials.buffer)

    def span(first: int) -> Ref:  # the chunks of first's binomial subtree
        end = first + subtree_size(fold.positions, first)
        return Ref(partials.buffer, start(first), start(end) - start(first))

    parent, children = binomial_family(fold.positions, position)
    for child in children:
        b.recv(to_rank(fold.rank_at(child)), span(child))
    if parent is not None:
        b.send(to_rank(fold.rank_at(parent)), span(position))
    return b.build()


def _ranks_from(nranks: int, root: int):
    """position counted from the root -> rank"""
    return lambda position: (position + root) % nranks
