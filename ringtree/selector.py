"""Choose an algorithm for `algorithm="auto"`.

A pure function of values equal on every rank, so every rank picks the same.
"""

# Up to this size the tree's 2·log2(N) steps cost less than the ring's 2(N-1)
# latencies; above it the ring's smaller, spread-out traffic wins.
TREE_MAX_BYTES = 64 * 1024


def select(nbytes: int, nranks: int) -> str:
    return "tree" if nbytes <= TREE_MAX_BYTES else "ring"
