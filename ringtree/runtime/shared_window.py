"""The node's shared window of a communicator, for the shared-memory transport (shm.py): made and
freed with the communicator's state; what each rank's part holds, and which rank may read which
one's memory directly (cross_memory.py)."""

from __future__ import annotations

import atexit
import os
from functools import partial

import numpy as np
from mpi4py import MPI

from .backoff import wait_until
from .cross_memory import allow_readers, read
from .failures import job_ends
from .stalls import watched

__all__ = ["SharedWindow", "ring_bytes", "SLOTS", "HEAD"]

SLOTS = 4  # per ring
RING_BYTES = (256 << 10, 1 << 20)  # the least and most bytes of one ring, as a node's ranks share 4 MiB each
PER_RANK_BYTES = 4 << 20
HEAD = 64  # bytes before a slot's data: tag, message bytes, piece bytes (or DIRECT) and its address, as int64
COUNTER = 64  # a counter to a cache line of its own
LIVE: list = []  # windows not yet freed, oldest first


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
        self.node, self.name = node, comm.Get_name()
        members = node.Get_group().Translate_ranks(list(range(node.Get_size())), comm.Get_group())
        self.local = {rank: k for k, rank in enumerate(members) if same_node[rank]}  # comm rank -> node rank
        self.window = None
        LIVE.append(self)
        if node.Get_size() < 2:
            return
        self.slot = ring_bytes(node.Get_size() - 1) // SLOTS
        self.count = node.Get_size()
        self.about_at = 2 * COUNTER * self.count  # pid, the part's address, and which peers it can read
        self.rings_at = self.about_at + -(-(16 + self.count) // COUNTER) * COUNTER
        self.window = MPI.Win.Allocate_shared(self.rings_at + self.count * SLOTS * self.slot, 1, comm=node)
        self.window.Lock_all()  # the passive epoch in which Win_sync orders loads and stores
        self.parts = [np.frombuffer(self.window.Shared_query(k)[0], np.uint8) for k in range(self.count)]
        self._find_readers()

    def _find_readers(self) -> None:
        """Which ranks of the node can read which one's memory directly (cross_memory.py): each tries
        to read every other's part and says so in its own; collective over the node."""
        me, at = self.node.Get_rank(), self.about_at
        allow_readers()
        self.parts[me][at:at + 16].view(np.int64)[:] = (os.getpid(), self.parts[me].ctypes.data)
        self._everyone_wrote()
        for k in range(self.count):
            probe = np.zeros(16, np.uint8)
            try:
                read(self.pid(k), int(self.parts[k][at:at + 16].view(np.int64)[1]) + at, probe)
                self.parts[me][at + 16 + k] = np.array_equal(probe, self.parts[k][at:at + 16])
            except OSError:
                self.parts[me][at + 16 + k] = 0
        self._everyone_wrote()

    def _everyone_wrote(self) -> None:
        self.window.Sync()
        self.node.Barrier()
        self.window.Sync()

    def pid(self, owner: int) -> int:
        return int(self.parts[owner][self.about_at:self.about_at + 8].view(np.int64)[0])

    def reads(self, reader: int, owner: int) -> bool:
        """Whether node rank `reader` can read node rank `owner`'s memory directly."""
        return bool(self.parts[reader][self.about_at + 16 + owner])

    @property
    def peers(self) -> frozenset:
        return frozenset(self.local) if self.window is not None else frozenset()

    def counter(self, owner: int, which: int, peer: int) -> np.ndarray:
        """Node rank `owner`'s count (an int64 view) of pieces written to (which 0) or consumed from
        (which 1) node rank `peer`."""
        at = COUNTER * (which * self.count + peer)
        return self.parts[owner][at:at + 8].view(np.int64)

    def ring(self, owner: int, peer: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The slots node rank `owner` writes to node rank `peer`: each one's header (4 int64: tag,
        message bytes, piece bytes or DIRECT, address) and body."""
        at = self.rings_at + peer * SLOTS * self.slot
        slots = self.parts[owner][at:at + SLOTS * self.slot].reshape(SLOTS, self.slot)
        return [(slot[:32].view(np.int64), slot[HEAD:]) for slot in slots]

    def free(self, keep: bool = False, progress=None) -> None:
        """Free the window, with the node's other ranks, each of which calls this at the same point: when
        the communicator's state is freed (CommState.free, which keeps a broken state's: `keep`), and for
        the windows left, at exit. MPI's Win_free waits for every rank, so whether to free it is the
        node's answer, never one rank's: the ranks' words combined (MAX), kept if any keeps it; a kept
        window is freed at exit. `progress()` moves the collectives in flight meanwhile (a node peer may
        wait for one of this rank's before it comes here)."""
        if self not in LIVE or job_ends():
            return  # freed; or a peer died, and the job ends at exit (failures.py): it would not answer
        if self.window is not None:
            word, answer = np.array([int(keep)], np.int64), np.zeros(1, np.int64)
            request = self.node.Iallreduce(word, answer, MPI.MAX)
            watched(partial(wait_until, request.Test, progress), f"the node's shared window of {self.name}, which every "
                    "rank of the node frees with its communicator (waiting for the others)")
            if answer[0]:
                return  # kept by some rank: freed at exit, where every rank frees what is left
            self.window.Unlock_all()
            self.window.Free()
        LIVE.remove(self)
        self.node.Free()


def _free_all() -> None:
    """At exit, before mpi4py finalizes MPI (whose network layer will not close while a window is
    registered with it): the windows left, in the order every rank made them."""
    if not MPI.Is_finalized():
        for window in list(LIVE):
            window.free()


atexit.register(_free_all)  # registered after mpi4py's own: run before it
