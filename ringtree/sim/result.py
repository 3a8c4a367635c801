"""The simulator's inputs and outputs as values: Costs in, SimResult (and its Events) out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..schedule import Ref

__all__ = ["Call", "Costs", "Event", "SimResult"]


class Call(NamedTuple):
    """The allreduce a simulation is of."""

    algorithm: str
    nranks: int
    nbytes: int  # whole elements of itemsize bytes
    itemsize: int = 4
    segment: int = 0  # bytes per segment; 0: not segmented

    @property
    def count(self) -> int:
        return self.nbytes // self.itemsize

    @property
    def segment_elements(self) -> int:
        return max(1, self.segment // self.itemsize) if self.segment else 0


class Costs(NamedTuple):
    """What the α-β-γ model charges (simulate.py's docstring says how each is used)."""

    alpha: float  # seconds per message
    beta: float  # seconds per byte sent
    gamma: float  # seconds per byte reduced or copied
    overhead: float = 0.0  # seconds per call, before any rank starts
    eager_limit: int | None = None  # bytes: larger messages cost alpha_rendezvous instead of alpha
    alpha_rendezvous: float | None = None
    duplex: bool = True  # a send port and a receive port per rank; False: one port for both
    setup: float = 0.0  # seconds a message holds both its ranks at its start
    # (α, β) of a message between nodes, which also holds each node's one link that way; None: nodes
    # are not told apart
    between_nodes: tuple[float, float] | None = None
    # bytes each node link passes at `beta` before its own rate holds, refilled at that rate (a token
    # bucket, as tc's tbf that scripts/cluster caps links with); None: none
    link_burst: int | None = None

    def check(self) -> None:
        """Raise ValueError for costs the simulator cannot take."""
        if self.link_burst is not None and (self.link_burst < 0 or self.between_nodes is None):
            raise ValueError(f"link_burst must be >= 0, with between_nodes, not {self.link_burst}")
        if self.between_nodes is not None and (len(self.between_nodes) != 2 or min(self.between_nodes) < 0):
            raise ValueError(f"between_nodes must be (alpha, beta), both >= 0, not {self.between_nodes}")
        if min(self.alpha, self.beta, self.gamma, self.overhead, self.setup) < 0:
            raise ValueError(f"alpha, beta, gamma, overhead and setup must be >= 0, not {self.alpha}, {self.beta}, "
                             f"{self.gamma}, {self.overhead}, {self.setup}")
        if ((self.eager_limit is None) != (self.alpha_rendezvous is None) or (self.alpha_rendezvous or 0) < 0
                or (self.eager_limit or 0) < 0):
            raise ValueError(f"eager_limit and alpha_rendezvous go together, both >= 0, not {self.eager_limit}, "
                             f"{self.alpha_rendezvous}")


class Event(NamedTuple):
    """One op as simulated."""

    rank: int
    index: int
    kind: str  # send, recv, reduce, copy
    peer: int | None
    start: float
    finish: float
    region: Ref  # sent, received into or written


@dataclass(frozen=True)
class SimResult:
    algorithm: str
    nranks: int
    nbytes: int
    itemsize: int
    segment: int  # bytes per segment; 0: not segmented
    time: float  # seconds until the last rank finishes
    finish: tuple[float, ...]  # per rank: when its last op finishes
    bytes_sent: tuple[int, ...]
    bytes_received: tuple[int, ...]
    messages_sent: tuple[int, ...]
    messages_received: tuple[int, ...]
    bytes_reduced: tuple[int, ...]
    events: tuple[Event, ...] | None = None  # with trace=True: every op, in order of start
