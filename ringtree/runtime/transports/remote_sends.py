"""Sends to ranks on other nodes: synchronous, and at most REMOTE_SENDS in flight to one rank.

A network path may stop taking messages from a peer that holds dozens it cannot match yet, and a
standard send can be done before its match, which lets a rank run that far ahead: MPICH's OFI
netmod over libfabric's tcp provider stops delivering to a rank that holds about 65 of them, and
both ranks of an exchange then wait for ever (docs/reliability.md). The engine sends to another
node with Issend, done only once matched, and asks `RemoteSends` for a turn first, so that the rank
holds at most REMOTE_SENDS of this process's messages unmatched, whatever the collectives in flight.
A send whose region the rank writes afterwards goes from a copy, so that the write need not wait
for the peer to match it (pipelined.py), as it need not for MPI's own buffering of a standard send.
"""

from __future__ import annotations

from collections import deque

__all__ = ["REMOTE_SENDS", "RemoteSends"]

# Per rank on another node, from this process. Over libfabric's tcp provider a rank stalled once it
# held 66 synchronous sends of one peer unmatched, and over tcp;ofi_rxm a 5-rank reduce on 2,1,2
# hosts stalled with 8 or 16 (their acknowledgements held back), not 24: docs/reliability.md.
REMOTE_SENDS = 32


class RemoteSends:
    """Per rank on another node (its peer key, CommState.peer_keys): our sends in flight to it, and
    the sends held for a turn, in the order they came. Each channel has at most one held send, as
    the next on a channel is posted only after it."""

    __slots__ = ("in_flight", "held")

    def __init__(self) -> None:
        self.in_flight: dict = {}
        self.held: dict = {}

    def take(self, key, execution, op: int) -> bool:
        """Whether a send to `key` may be posted now (counted if so); if not, it is held."""
        sending = self.in_flight.get(key, 0)
        if sending < REMOTE_SENDS:
            self.in_flight[key] = sending + 1
            return True
        self.held.setdefault(key, deque()).append((execution, op))
        return False

    def done(self, key):
        """A send to `key` is done or let go: the (execution, op) held longest for it, to post now
        through `take`, or None."""
        self.in_flight[key] -= 1
        held = self.held.get(key)
        return held.popleft() if held else None

    def held_ops(self, execution) -> list[int]:
        return [op for held in list(self.held.values()) for owner, op in list(held) if owner is execution]

    def drop(self, execution) -> None:
        """Forget `execution`'s held sends (it is abandoned)."""
        for key, held in self.held.items():
            self.held[key] = deque(entry for entry in held if entry[0] is not execution)
