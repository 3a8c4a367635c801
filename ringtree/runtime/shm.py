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
waits for a receive. A message of DIRECT_MIN_BYTES or more, to a peer that can read
this rank's memory, goes as one piece that says where it lies: the receiver copies
it from there (cross_memory.py) before it consumes the piece, and the send is done
once the piece is consumed.

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

import os
import time
from collections import deque

import numpy as np

from .cross_memory import read
from .ipc import WrongSize
from .shared_window import SLOTS, SharedWindow

__all__ = ["ShmTransport", "Sending", "Receiving", "tick", "DIRECT_MIN_BYTES"]

DIRECT = -1  # a piece that says where the message is, for the receiver to read it there (cross_memory.py)
DIRECT_MIN_BYTES = 1 << 18  # smaller ones go through the slots: below, two copies cost less than a read
EAGER_AFTER_SECONDS = 0.05  # without a ring moving, before messages whose receive is not posted are taken
TICK = [0]  # polls of the collectives in flight: a transport moves its rings once per poll (tick())
MOVED = [False]  # whether a ring moved since the last tick: progress for the waiter, as a completion is


def tick() -> bool:
    """A new poll begins; says whether a ring moved in the last."""
    TICK[0] += 1
    moved, MOVED[0] = MOVED[0], False
    return moved


class Outbox:
    """This rank's ring to one peer: the messages to write into it, in posting order."""

    __slots__ = ("slots", "written", "consumed", "count", "sending", "sync", "direct")

    def __init__(self, window: SharedWindow, me: int, peer: int) -> None:
        self.slots = window.ring(me, peer)
        self.written = window.counter(me, 0, peer)
        self.consumed = window.counter(peer, 1, me)
        self.count = int(self.written[0])
        self.sending: deque = deque()
        self.sync = window.window.Sync
        self.direct = window.reads(peer, me)  # the peer reads large messages out of this rank's memory

    def move(self) -> bool:
        """Write what the free slots take; say whether any piece went."""
        moved = False
        while self.sending:
            message = self.sending[0]
            if self.count - int(self.consumed[0]) >= SLOTS:
                self.sync()  # the reader's copy out of the slot before this rank's copy into it
                if self.count - int(self.consumed[0]) >= SLOTS:
                    return moved
            head, body = self.slots[self.count % SLOTS]
            data = message.data
            head[0], head[1] = message.tag, data.size
            if message.piece == DIRECT:  # the peer reads it where it is: done once that piece is consumed
                head[2], head[3] = DIRECT, data.ctypes.data
                message.piece, message.sent = self.count, data.size
            else:
                size = min(body.size, data.size - message.sent)
                body[:size] = data[message.sent:message.sent + size]
                head[2] = size
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

    __slots__ = ("data", "got", "receiving")

    def __init__(self, data: np.ndarray, receiving=None) -> None:
        self.data, self.got, self.receiving = data, 0, receiving


class Inbox:
    """The peer's ring to this rank: pieces taken in order, each to its message."""

    __slots__ = ("peer", "slots", "written", "consumed", "count", "posted", "kept", "current", "sync", "pid",
                 "read_directly", "messages_kept")

    def __init__(self, window: SharedWindow, me: int, node_peer: int, peer: int) -> None:
        self.peer = peer
        self.pid = window.pid(node_peer)
        self.read_directly = self.messages_kept = 0  # messages read where the peer keeps them; kept
        self.slots = window.ring(node_peer, me)
        self.written = window.counter(node_peer, 0, me)
        self.consumed = window.counter(me, 1, node_peer)
        self.count = int(self.consumed[0])
        self.posted: dict[int, deque] = {}  # tag -> receives posted and not yet begun, oldest first
        self.kept: dict[int, deque] = {}  # tag -> Arrivals begun before their receive was posted
        self.current: Arrival | None = None  # the message whose pieces come next
        self.sync = window.window.Sync

    def move(self, eager: bool) -> bool:
        """Take the pieces that have come, in order; a message whose receive is not posted yet only
        when `eager` (it is then kept, at the cost of a copy), else it waits in the ring."""
        moved = False
        while int(self.written[0]) > self.count:
            self.sync()  # the slot's bytes as the writer left them before its count
            head, body = self.slots[self.count % SLOTS]
            tag, total, size, address = head.tolist()
            arrival = self.current
            if arrival is None:
                if not eager and not self.posted.get(tag):
                    return moved
                arrival = self.current = self._begin(tag, total)
            if size == DIRECT:
                try:
                    read(self.pid, address, arrival.data)
                except OSError as error:  # it could at set-up: the peer's process is gone
                    raise RuntimeError(f"ringtree: cannot read rank {self.peer}'s memory: {error}") from None
                size = total
                self.read_directly += 1
            else:
                arrival.data[arrival.got:arrival.got + size] = body[:size]
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
                return Arrival(np.empty(total, np.uint8))  # read and dropped: the ring goes on
            return Arrival(receiving.target, receiving)
        arrival = Arrival(np.empty(total, np.uint8))
        self.kept.setdefault(tag, deque()).append(arrival)
        self.messages_kept += 1
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
        self.peers = window.peers - {rank}
        me = window.local[rank]
        self.outboxes = {p: Outbox(window, me, window.local[p]) for p in self.peers}
        self.inboxes = {p: Inbox(window, me, window.local[p], p) for p in self.peers}
        self.ticked = -1
        self.last_moved = time.perf_counter()

    def progress(self) -> None:
        """Move every ring, once per poll. A message whose receive is not posted waits in its ring (a
        peer one call ahead would else cost a copy of every message), unless no ring has moved for
        EAGER_AFTER_SECONDS: then calls in flight together may wait for each other's messages, which
        MPI would match by tag in any order, and the rings are emptied into kept messages."""
        if self.ticked == TICK[0]:
            return
        self.ticked = TICK[0]
        moved = False
        for outbox in self.outboxes.values():
            if outbox.sending:
                moved |= outbox.move()
        now = time.perf_counter()
        eager = now - self.last_moved > EAGER_AFTER_SECONDS
        for inbox in self.inboxes.values():
            moved |= inbox.move(eager)
        if moved:
            self.last_moved = now
            MOVED[0] = True

    def arrived_tags(self) -> list[tuple[int, int]]:
        """(peer, tag) of every message come that no receive has taken yet, kept or waiting at the head
        of its ring: a call's that the ranks differ on (mismatch.Watch)."""
        found = [(inbox.peer, tag) for inbox in self.inboxes.values() for tag, kept in inbox.kept.items() if kept]
        for inbox in self.inboxes.values():
            if inbox.current is None and int(inbox.written[0]) > inbox.count:
                inbox.sync()
                found.append((inbox.peer, int(inbox.slots[inbox.count % SLOTS][0][0])))
        return found

    def gone(self, peers) -> list[int]:
        """Those of `peers` reached by this transport whose process has ended (or is a zombie, not yet
        reaped by its launcher)."""
        return [peer for peer in peers if peer in self.inboxes and not _alive(self.inboxes[peer].pid)]

    def message(self, execution, send: bool, peer: int, buffer, elements: slice):
        """A SEND (`send`) or RECV of `execution` (engine.py) with a peer of the node, as work the engine polls."""
        region = buffer[elements].view(np.uint8)
        if send:
            return Sending(self, self.outboxes[peer], execution.tag, region)
        return Receiving(self, self.inboxes[peer], execution.tag, region)

    def close(self) -> None:
        """The window is the communicator's (CommState.free frees it)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except ProcessLookupError:
        return False
    except OSError:  # no /proc, or no right to look: alive as far as this rank can tell
        return True


class Sending:
    """A SEND: done once its last piece is in the ring (the region may then change)."""

    __slots__ = ("transport", "outbox", "tag", "data", "sent", "piece")

    def __init__(self, transport: ShmTransport, outbox: Outbox, tag: int, data: np.ndarray) -> None:
        self.transport, self.outbox, self.tag, self.data, self.sent = transport, outbox, tag, data, 0
        # DIRECT: to be read where it is; then the number of the piece that says where
        self.piece = DIRECT if outbox.direct and data.size >= DIRECT_MIN_BYTES else None
        outbox.sending.append(self)
        if len(outbox.sending) == 1:
            outbox.move()

    @property
    def done(self) -> bool:
        if self.piece is None and self.sent == self.data.size and self.data.size:
            return True
        self.transport.progress()
        if self.piece is not None and self.piece != DIRECT:
            if int(self.outbox.consumed[0]) <= self.piece:
                return False
            self.outbox.sync()  # the peer's read before this rank's next write of the region
            return True
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

