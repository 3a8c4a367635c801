"""The shared-memory transport: host memory between ranks of one node, through rings in an MPI-3
shared window, with no MPI message.

Theory of operation. The ranks of a node allocate one shared window together
(`MPI.Win.Allocate_shared`) when the communicator is set up. Each rank's part holds,
for every other rank of its node, a ring of SLOTS slots it writes to that rank, and
two counters per peer: the pieces it has written to the peer, and the pieces of the
peer's ring it has consumed. A message larger than a slot goes as consecutive
pieces; the messages to one peer go in the order they were posted, one at a time,
so a message's pieces are consecutive in its ring. Each piece carries its message's
tag (the call's) and size: the receiver gives it to the oldest unfinished receive of
that tag from that rank, and keeps a piece that comes before its receive is posted
in a message of its own (as MPI keeps an unexpected message), so that a ring never
waits for a receive.

Memory ordering. The writer copies a piece and its header into a free slot, then
`Win_sync`, then stores its count of pieces written; the reader loads that count,
`Win_sync`, reads the slot, `Win_sync`, stores its count consumed; the writer reuses
a slot only after it has loaded a count consumed past it and called `Win_sync`.
`Win_sync` is MPI's memory barrier for a shared window in the unified model (a full
fence in MPICH and Open MPI): no store before it is seen after a store after it,
which a copy of non-temporal stores would otherwise allow. A count is an aligned
8-byte word, stored and loaded whole.

Nothing spins outside the engine's one waiter: the rings are moved on by every poll
of the collectives in flight (Sending.done, Receiving.done), and a wait with nothing
to move backs off as every wait does.
"""

from __future__ import annotations

import atexit
import time
from collections import deque

import numpy as np
from mpi4py import MPI

from .backoff import wait_until
from .ipc import WrongSize

__all__ = ["SharedWindow", "ShmTransport", "Sending", "Receiving", "RING_BYTES"]

SLOTS = 4  # per ring
RING_BYTES = (256 << 10, 1 << 20)  # the least and most bytes of one ring, as a node's ranks share 4 MiB each
PER_RANK_BYTES = 4 << 20
HEAD = 64  # bytes before a slot's data: tag, message bytes, piece bytes (int64), cache-line aligned
COUNTER = 64  # a counter to a cache line of its own
LIVE: list = []  # windows not yet freed, oldest first
FREE_WAIT_SECONDS = 1.0  # for the node's other ranks to free the window too
TICK = [0]  # polls of the collectives in flight: a transport moves its rings once per poll (tick())
MOVED = [False]  # whether a ring moved since the last tick: progress for the waiter, as a completion is


def tick() -> bool:
    """A new poll begins; says whether a ring moved in the last."""
    TICK[0] += 1
    moved, MOVED[0] = MOVED[0], False
    return moved


def ring_bytes(peers: int) -> int:
    """The bytes of one ring, where a rank writes to `peers` others: a power of two."""
    low, high = RING_BYTES
    size = high
    while size > low and size * peers > PER_RANK_BYTES:
        size //= 2
    return size


class SharedWindow:
    """The node's shared window of one communicator; collective over the communicator."""

    def __init__(self, comm: MPI.Comm, same_node: list) -> None:
        """`same_node[r]`: whether rank r of `comm` is on this rank's node in ringtree's node map
        (MPI's own may join more ranks, which the window then leaves out)."""
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.node = node
        members = node.Get_group().Translate_ranks(list(range(node.Get_size())), comm.Get_group())
        self.local = {rank: k for k, rank in enumerate(members) if same_node[rank]}  # comm rank -> node rank
        self.window = None
        LIVE.append(self)
        if node.Get_size() < 2:
            return
        self.slot = ring_bytes(node.Get_size() - 1) // SLOTS
        self.count = node.Get_size()
        self.rings_at = 2 * COUNTER * self.count
        self.window = MPI.Win.Allocate_shared(self.rings_at + self.count * SLOTS * self.slot, 1, comm=node)
        self.window.Lock_all()  # the passive epoch in which Win_sync orders loads and stores
        self.parts = [np.frombuffer(self.window.Shared_query(k)[0], np.uint8) for k in range(self.count)]

    @property
    def peers(self) -> frozenset:
        return frozenset(self.local) if self.window is not None else frozenset()

    def counter(self, owner: int, which: int, peer: int) -> np.ndarray:
        """Node rank `owner`'s count (an int64 view) of pieces written to (which 0) or consumed from
        (which 1) node rank `peer`."""
        at = COUNTER * (which * self.count + peer)
        return self.parts[owner][at:at + 8].view(np.int64)

    def ring(self, owner: int, peer: int) -> np.ndarray:
        """The slots node rank `owner` writes to node rank `peer`, one row each."""
        at = self.rings_at + peer * SLOTS * self.slot
        return self.parts[owner][at:at + SLOTS * self.slot].reshape(SLOTS, self.slot)

    def free(self) -> None:
        """Free the window where every rank of the node frees it too: a rank that keeps its state (a
        call broke there, CommState.free) never would, and MPI's Win_free waits for every rank."""
        if self not in LIVE:
            return  # freed, or kept
        LIVE.remove(self)
        if self.window is not None:
            everyone = self.node.Ibarrier()
            deadline = time.perf_counter() + FREE_WAIT_SECONDS
            wait_until(lambda: everyone.Test() or time.perf_counter() > deadline)
            if not everyone.Test():
                return  # kept, as that rank's state is
            self.window.Unlock_all()
            self.window.Free()
        self.node.Free()


def _free_all() -> None:
    """At exit, before mpi4py finalizes MPI (whose network layer will not close while a window is
    registered with it): the windows left, in the order every rank made them."""
    if not MPI.Is_finalized():
        for window in list(LIVE):
            window.free()


class Outbox:
    """This rank's ring to one peer: the messages to write into it, in posting order."""

    __slots__ = ("slots", "written", "consumed", "count", "sending", "sync")

    def __init__(self, window: SharedWindow, me: int, peer: int) -> None:
        self.slots = window.ring(me, peer)
        self.written = window.counter(me, 0, peer)
        self.consumed = window.counter(peer, 1, me)
        self.count = int(self.written[0])
        self.sending: deque = deque()
        self.sync = window.window.Sync

    def move(self) -> bool:
        """Write what the free slots take; say whether any piece went."""
        moved = False
        while self.sending:
            message = self.sending[0]
            if self.count - int(self.consumed[0]) >= SLOTS:
                self.sync()  # the reader's copy out of the slot before this rank's copy into it
                if self.count - int(self.consumed[0]) >= SLOTS:
                    return moved
            slot = self.slots[self.count % SLOTS]
            data = message.data
            size = min(slot.size - HEAD, data.size - message.sent)
            slot[HEAD:HEAD + size] = data[message.sent:message.sent + size]
            slot[:24].view(np.int64)[:] = (message.tag, data.size, size)
            message.sent += size
            self.count += 1
            self.sync()
            self.written[0] = self.count
            moved = True
            if message.sent == data.size:
                self.sending.popleft()
        return moved


class Arrival:
    """A message from one peer: bytes written into the receive's target, or kept until it is posted."""

    __slots__ = ("tag", "data", "got", "receiving")

    def __init__(self, tag: int, data: np.ndarray, receiving=None) -> None:
        self.tag, self.data, self.got, self.receiving = tag, data, 0, receiving


class Inbox:
    """The peer's ring to this rank: pieces taken in order, each to its message."""

    __slots__ = ("peer", "slots", "written", "consumed", "count", "posted", "kept", "current", "sync")

    def __init__(self, window: SharedWindow, me: int, node_peer: int, peer: int) -> None:
        self.peer = peer
        self.slots = window.ring(node_peer, me)
        self.written = window.counter(node_peer, 0, me)
        self.consumed = window.counter(me, 1, node_peer)
        self.count = int(self.consumed[0])
        self.posted: dict[int, deque] = {}  # tag -> receives posted and not yet begun, oldest first
        self.kept: dict[int, deque] = {}  # tag -> Arrivals begun before their receive was posted
        self.current: Arrival | None = None  # the message whose pieces come next
        self.sync = window.window.Sync

    def move(self) -> bool:
        moved = False
        while int(self.written[0]) > self.count:
            self.sync()  # the slot's bytes as the writer left them before its count
            slot = self.slots[self.count % SLOTS]
            tag, total, size = (int(v) for v in slot[:24].view(np.int64))
            arrival = self.current
            if arrival is None:
                arrival = self.current = self._begin(tag, total)
            arrival.data[arrival.got:arrival.got + size] = slot[HEAD:HEAD + size]
            arrival.got += size
            self.count += 1
            self.sync()
            self.consumed[0] = self.count
            moved = True
            if arrival.got == arrival.data.size:
                self.current = None
                if arrival.receiving is not None:
                    arrival.receiving.finished = True
        return moved

    def _begin(self, tag: int, total: int) -> Arrival:
        waiting = self.posted.get(tag)
        if waiting:
            receiving = waiting.popleft()
            if receiving.target.size != total:
                receiving.error = WrongSize(self.peer, total, receiving.target.size)
                return Arrival(tag, np.empty(total, np.uint8))  # read and dropped: the ring goes on
            return Arrival(tag, receiving.target, receiving)
        arrival = Arrival(tag, np.empty(total, np.uint8))
        self.kept.setdefault(tag, deque()).append(arrival)
        return arrival

    def post(self, receiving) -> None:
        kept = self.kept.get(receiving.tag)
        if kept:
            arrival = kept.popleft()
            if arrival.data.size != receiving.target.size:
                receiving.error = WrongSize(self.peer, arrival.data.size, receiving.target.size)
            elif arrival.got == arrival.data.size:
                receiving.target[:] = arrival.data
                receiving.finished = True
            else:  # its remaining pieces go straight to the target
                receiving.target[:arrival.got] = arrival.data[:arrival.got]
                arrival.data, arrival.receiving = receiving.target, receiving
            return
        self.posted.setdefault(receiving.tag, deque()).append(receiving)


class ShmTransport:
    """One communicator's rings to and from the ranks of its node."""

    def __init__(self, window: SharedWindow, rank: int) -> None:
        self.window = window
        self.peers = window.peers - {rank}
        me = window.local[rank]
        self.outboxes = {p: Outbox(window, me, window.local[p]) for p in self.peers}
        self.inboxes = {p: Inbox(window, me, window.local[p], p) for p in self.peers}
        self.ticked = -1

    def progress(self) -> None:
        """Move every ring, once per poll."""
        if self.ticked == TICK[0]:
            return
        self.ticked = TICK[0]
        moved = False
        for outbox in self.outboxes.values():
            if outbox.sending:
                moved |= outbox.move()
        for inbox in self.inboxes.values():
            moved |= inbox.move()
        MOVED[0] |= moved

    def message(self, execution, send: bool, peer: int, buffer, elements: slice):
        """A SEND (`send`) or RECV of `execution` (engine.py) with a peer of the node, as work the engine polls."""
        region = buffer[elements].view(np.uint8)
        if send:
            return Sending(self, self.outboxes[peer], execution.tag, region)
        return Receiving(self, self.inboxes[peer], execution.tag, region)

    def close(self) -> None:
        """The window is the communicator's (CommState.free frees it)."""


class Sending:
    """A SEND: done once its last piece is in the ring (the region may then change)."""

    __slots__ = ("transport", "outbox", "tag", "data", "sent")

    def __init__(self, transport: ShmTransport, outbox: Outbox, tag: int, data: np.ndarray) -> None:
        self.transport, self.outbox, self.tag, self.data, self.sent = transport, outbox, tag, data, 0
        outbox.sending.append(self)
        if len(outbox.sending) == 1:
            outbox.move()

    @property
    def done(self) -> bool:
        if self.sent == self.data.size and self.data.size:
            return True
        self.transport.progress()
        return self.sent == self.data.size and self not in self.outbox.sending

    def cancel(self) -> None:
        if self in self.outbox.sending and self.sent == 0:
            self.outbox.sending.remove(self)


class Receiving:
    """A RECV: done once its message's last piece is in its target."""

    __slots__ = ("transport", "inbox", "tag", "target", "finished", "error")

    def __init__(self, transport: ShmTransport, inbox: Inbox, tag: int, target: np.ndarray) -> None:
        self.transport, self.inbox, self.tag, self.target = transport, inbox, tag, target
        self.finished = False
        self.error: WrongSize | None = None
        inbox.post(self)

    @property
    def done(self) -> bool:
        if not self.finished:
            self.transport.progress()
        if self.error is not None:
            raise self.error
        return self.finished

    def cancel(self) -> None:
        waiting = self.inbox.posted.get(self.tag)
        if waiting and self in waiting:
            waiting.remove(self)


atexit.register(_free_all)  # registered after mpi4py's own: run before it
