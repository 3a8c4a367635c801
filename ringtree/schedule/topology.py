"""Which ranks share a node: what a node-aware generator, the simulator and `draw` read.

Pure data, as the schedules are. The runtime learns it once per communicator
(runtime/session/state.py: MPI's shared-memory split and one allgather); a generator
that takes no topology treats every rank alike.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Topology"]


class Topology(NamedTuple):
    """The node of every rank, nodes numbered in the order their first rank comes."""

    node_of: tuple[int, ...]

    @classmethod
    def of(cls, labels) -> Topology:
        """From any per-rank node label (a leader's rank, a host name), renumbered 0, 1, ... by first rank."""
        numbers: dict = {}
        return cls(tuple(numbers.setdefault(label, len(numbers)) for label in labels))

    @classmethod
    def flat(cls, nranks: int) -> Topology:
        """Every rank on one node."""
        return cls((0,) * nranks)

    @classmethod
    def parse(cls, text: str) -> Topology:
        """From ranks per node in block order, as "2,1,2" (command lines and tests)."""
        try:
            sizes = [int(part) for part in text.split(",")]
        except ValueError:
            raise ValueError(f"{text!r} is not ranks per node such as 2,2 or 2,1,2") from None
        return cls.placed(sizes)

    @classmethod
    def placed(cls, sizes, placement: str = "block") -> Topology:
        """`sizes[k]` ranks on node k, placed "block" (node 0's first) or "round-robin" (rank r on node
        r mod K, for nodes of one size): as scripts/cluster places them."""
        if not sizes or min(sizes) < 1:
            raise ValueError(f"{','.join(map(str, sizes))!r}: every node needs at least one rank")
        if placement == "round-robin":
            if len(set(sizes)) > 1:
                raise ValueError("round-robin placement takes an even layout")
            return cls.of(rank % len(sizes) for rank in range(sum(sizes)))
        return cls(tuple(node for node, size in enumerate(sizes) for _ in range(size)))

    @property
    def nranks(self) -> int:
        return len(self.node_of)

    @property
    def nodes(self) -> int:
        return max(self.node_of, default=-1) + 1

    def ranks_on(self, node: int) -> tuple[int, ...]:
        return tuple(rank for rank, n in enumerate(self.node_of) if n == node)

    @property
    def ranks_per_node(self) -> tuple[int, ...]:
        return tuple(len(self.ranks_on(node)) for node in range(self.nodes))

    @property
    def node_order(self) -> tuple[int, ...]:
        """The ranks node by node, each node's in rank order: a ring in this order crosses each
        boundary between nodes once."""
        return tuple(sorted(range(self.nranks), key=lambda rank: (self.node_of[rank], rank)))

    def crossings(self, order) -> int:
        """How many hops of a ring through `order` go from one node to another."""
        return sum(self.node_of[a] != self.node_of[b] for a, b in zip(order, order[1:] + order[:1]))

    def __str__(self) -> str:
        sizes = self.ranks_per_node
        if len(set(sizes)) == 1:
            shape = f"{self.nodes} node{'s' * (self.nodes > 1)} × {sizes[0]}"
        else:
            shape = f"{self.nodes} nodes of {','.join(map(str, sizes))}"
        if self.nodes > 1 and self.node_order != tuple(range(self.nranks)):
            shape += ", ranks interleaved"
        return shape
