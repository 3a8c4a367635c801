"""Double binary tree allreduce (Sanders, Speck and Träff, 2009; NCCL 2.4).

Half of the message is reduced up one binary tree and broadcast back down it;
the other half takes a second tree in which the first tree's leaves are the
inner nodes (the mirror image when N is even, a shift by one rank when N is
odd). So no rank forwards for both trees: each rank sends and receives about
twice the message in all, evenly, and no root receives everything. Segmenting
(the pipeline pass) streams both halves up and down at once.

The first tree is in-order: rank r's level is its lowest set bit, its children
sit half that bit below and above it, and rank 0 is a root with one child.
"""

from ..schedule import INPUT, OUTPUT, Ref, Schedule, ScheduleBuilder, even_chunks


def in_order_tree(nranks: int, rank: int) -> tuple[int | None, list[int]]:
    """(parent, children) of `rank` in the in-order binary tree on ranks 0..nranks-1."""
    bit = 1
    while bit < nranks and not rank & bit:
        bit <<= 1
    if rank == 0:
        return None, [bit >> 1] if nranks > 1 else []
    parent = (rank ^ bit) | (bit << 1)
    if parent >= nranks:
        parent = rank ^ bit
    children = []
    step = bit >> 1
    if step:
        children.append(rank - step)
        while step and rank + step >= nranks:
            step >>= 1
        if step:
            children.append(rank + step)
    return parent, children


def second_tree(nranks: int, rank: int) -> tuple[int | None, list[int]]:
    """(parent, children) in the complementary tree: mirrored for even N, shifted by one for odd N."""
    if nranks % 2 == 0:
        parent, children = in_order_tree(nranks, nranks - 1 - rank)
        mirror = lambda r: nranks - 1 - r  # noqa: E731
    else:
        parent, children = in_order_tree(nranks, (rank - 1) % nranks)
        mirror = lambda r: (r + 1) % nranks  # noqa: E731
    return (None if parent is None else mirror(parent)), [mirror(c) for c in children]


def double_tree_allreduce(nranks: int, rank: int, count: int) -> Schedule:
    b = ScheduleBuilder("double_tree", nranks, rank, count)
    if nranks == 1:
        b.copy(Ref(OUTPUT, 0, count), Ref(INPUT, 0, count))
        return b.build()
    halves = even_chunks(count, 2)
    slots = b.scratch("incoming", 2 * max(size for _, size in halves))
    trees = [(family(nranks, rank), Ref(INPUT, offset, size), Ref(OUTPUT, offset, size))
             for family, (offset, size) in zip((in_order_tree, second_tree), halves)]
    # Both reductions, then both broadcasts: a pair of ranks then exchanges its messages in the same
    # phase order on both sides, and one tree's reduction never queues behind the other's broadcast.
    for (parent, children), mine, result in trees:
        partial = mine
        for i, child in enumerate(children):
            slot = Ref(slots.buffer, i * mine.count, mine.count)
            b.recv(child, slot)
            b.reduce(result, partial, slot)
            partial = result
        if parent is not None:
            b.send(parent, partial)
        elif not children:
            b.copy(result, mine)
    for (parent, children), _, result in trees:
        if parent is not None:
            b.recv(parent, result)
        for child in children:
            b.send(child, result)
    return b.build()
