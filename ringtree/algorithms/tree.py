"""Binomial-tree allreduce: reduce up a binomial tree to rank 0, broadcast back down.

Rank r's parent is r with its lowest set bit cleared; its children are r + 2^k
for every 2^k below that bit. A rank adds its children's partial sums to its
input, smallest subtree first, and passes the total to its parent; the result
then flows back down, largest subtree first. 2·⌈log2 N⌉ steps, each carrying
the whole message.
"""

from ..schedule.ir import INPUT, OUTPUT, Ref, Schedule, ScheduleBuilder


def binomial_family(nranks: int, rank: int) -> tuple[int | None, list[int]]:
    """(parent, children in ascending subtree size) of `rank` in a binomial tree rooted at 0."""
    children = []
    mask = 1
    while mask < nranks:
        if rank & mask:
            return rank - mask, children
        if rank + mask < nranks:
            children.append(rank + mask)
        mask <<= 1
    return None, children


def tree_allreduce(nranks: int, rank: int, count: int) -> Schedule:
    b = ScheduleBuilder("tree", nranks, rank, count)
    parent, children = binomial_family(nranks, rank)
    mine, result = Ref(INPUT, 0, count), Ref(OUTPUT, 0, count)

    # Two receive slots, so one child's data can arrive while another's is added.
    incoming = b.scratch("incoming", 2 * count if len(children) > 1 else count)
    partial = mine
    for i, child in enumerate(children):
        slot = Ref(incoming.buffer, (i % 2) * count, count)
        b.recv(child, slot)
        b.reduce(result, partial, slot)
        partial = result

    if parent is not None:
        b.send(parent, partial)
        b.recv(parent, result)
    elif not children:
        b.copy(result, mine)
    for child in reversed(children):
        b.send(child, result)

    return b.build()
