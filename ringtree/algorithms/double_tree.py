"""Double binary tree allreduce (after Sanders, Speck and Träff, 2009, and NCCL 2.4).

Half of the message is reduced up one binary tree and broadcast back down it;
the other half takes a second tree whose inner nodes are the first tree's
leaves. So no rank forwards for both trees: each rank moves at most about twice
the message in each direction, evenly, and no root receives everything.
Segmenting (the pipeline pass) streams both halves up and down at once.

Both trees are heap-shaped: in the first, rank r's children are 2r+1 and 2r+2,
so ranks below ⌊N/2⌋ are inner nodes and the rest are leaves; the second is the
same tree with every rank moved ⌈N/2⌉ places on (mod N), which makes the
first tree's leaves its inner nodes. (NCCL pairs in-order trees, mirrored or
shifted; there rank 0 is a root with one child, which at small N loads some
ranks with four tree edges where three would do, and for odd N leaves rank 0
inner in both trees.)
"""

from ..schedule.ir import INPUT, OUTPUT, Ref, Schedule, ScheduleBuilder, even_chunks, single_rank


def heap_tree(nranks: int, rank: int, shift: int = 0) -> tuple[int | None, list[int]]:
    """(parent, children) of `rank` in the heap-shaped binary tree whose root is rank `shift`
    (positions counted from it, mod nranks)."""
    position = (rank - shift) % nranks
    parent = (position - 1) // 2 if position else None
    children = [c for c in (2 * position + 1, 2 * position + 2) if c < nranks]
    to_rank = lambda p: (p + shift) % nranks  # noqa: E731
    return (None if parent is None else to_rank(parent)), [to_rank(c) for c in children]


def tree_pair(nranks: int, rank: int) -> list[tuple[int | None, list[int]]]:
    """This rank's (parent, children) in each of the two complementary trees."""
    return [heap_tree(nranks, rank), heap_tree(nranks, rank, (nranks + 1) // 2)]


def double_tree_allreduce(nranks: int, rank: int, count: int) -> Schedule:
    if nranks == 1:
        return single_rank("double_tree", count)
    b = ScheduleBuilder("double_tree", nranks, rank, count)
    halves = even_chunks(count, 2)
    slots = b.scratch("incoming", 2 * max(size for _, size in halves))
    trees = [(family, Ref(INPUT, offset, size), Ref(OUTPUT, offset, size))
             for family, (offset, size) in zip(tree_pair(nranks, rank), halves)]
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
