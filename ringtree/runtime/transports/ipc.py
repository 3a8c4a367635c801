"""The IPC transport: device memory between ranks of one node, copied by the receiving device.

Theory of operation. A schedule's SEND to a rank of the same node becomes a small
header on MPI: which of the sender's allocations holds the region (a key, and the
allocation's IPC handle), at which byte offset, how many bytes. The receiver maps
the allocation once (the layer's `open`), copies the region out of it on the
call's stream, and when that copy has finished answers with an ack; the SEND is
done when the ack arrives, and only then may the sender overwrite the region.
Everything else about ordering the engine already does: a SEND is issued once its
data is final (the work that wrote it is done), a RECV once its region is free.

Headers and acks between two ranks travel on the call's own tag, in both
directions, so a pair of ranks keeps one `Channel` per call. It posts at once a
receive of `MESSAGE` bytes for every message the peer will send it in the call
(a header for each RECV from it, an ack for each SEND to it: posted any later, a
message could wait for a receive that waits for it), and reads what arrives in
posting order, which is the peer's sending order: headers go to the receives in
schedule order, acks to the sends. A receive acks only after the receive before
it on the same channel, so acks come in the order of the sends they answer.

Registration: the sender keeps its exports by allocation (base, size and the
allocation's identity, which a new allocation at the same address does not
share). A new allocation overlapping an exported one means that one was freed:
its key is retired, and the next headers to every peer that mapped it say so, so
that the peer unmaps it. Receivers keep what they mapped by (peer, key).

The device layer is CUDA's (`CudaLayer`: cudaIpcGetMemHandle / OpenMemHandle) or,
for tests without a GPU, one over shared memory (tests/fake_device.py).
"""

from __future__ import annotations

import ctypes
import struct
from collections import deque
from typing import NamedTuple, Protocol

import numpy as np
from mpi4py import MPI

from ...debug import log

__all__ = ["Allocation", "DeviceLayer", "IpcTransport", "CudaLayer", "HEADER", "MESSAGE"]

BYTE = MPI.BYTE
RETIRED_PER_HEADER = 4
HANDLE_BYTES = 64  # cudaIpcMemHandle_t
# kind (HEADER_KIND), key, allocation bytes, offset, bytes, retired keys (-1: none), handle
HEADER = struct.Struct(f"<qqqqq{RETIRED_PER_HEADER}q{HANDLE_BYTES}s")
MESSAGE = HEADER.size  # every receive on a channel takes this much: a header, or an ack
HEADER_KIND, ACK_KIND = 1, 2
ACK = np.frombuffer(struct.pack("<q", ACK_KIND), np.uint8)
MAX_EXPORTS = 256  # allocations a rank keeps exported; the oldest is retired beyond that


class Allocation(NamedTuple):
    base: int  # address of the allocation
    size: int  # bytes
    identity: int  # differs between two allocations made at the same address


class DeviceLayer(Protocol):
    """What the transport asks of a device's memory."""

    name: str

    def allocation(self, array) -> tuple[Allocation, int]:
        """The allocation holding `array`'s memory, and the byte offset of `array` in it."""

    def export(self, allocation: Allocation) -> bytes:
        """A handle another process of this node can map the allocation with (≤ HANDLE_BYTES)."""

    def open(self, handle: bytes, size: int):
        """Map a peer's allocation: a 1-D uint8 array of `size` bytes over it."""

    def close(self, mapped) -> None: ...


class Export(NamedTuple):
    key: int
    allocation: Allocation
    handle: bytes
    mapped_by: set  # peers that have been sent it


class IpcTransport:
    """One communicator's IPC state for one device layer: what this rank exports and what it mapped."""

    def __init__(self, layer: DeviceLayer, comm: MPI.Comm, peers: frozenset[int]) -> None:
        self.layer = layer
        self.comm = comm
        self.peers = peers  # the ranks messages to and from which go by IPC
        self.exports: dict[int, Export] = {}  # by allocation base, oldest first
        self.next_key = 0
        self.retiring: dict[int, list[int]] = {}  # peer -> keys it mapped that are gone
        self.mapped: dict[tuple[int, int], object] = {}  # (peer, key) -> the mapped allocation
        self.acks: list[MPI.Request] = []  # acks sent, not yet known to be complete
        self.stats = {"exported": 0, "retired": 0, "opened": 0, "closed": 0, "headers": 0}

    def header(self, buffer, elements: slice, peer: int, exported: dict) -> np.ndarray:
        """The header that tells `peer` where `buffer[elements]` lies; `exported` keeps each buffer's
        export and offset for the rest of the call (the allocation's lookup is the costly part)."""
        nbytes = (elements.stop - elements.start) * buffer.itemsize
        export = None
        if nbytes:  # else nothing to map (an empty array may have no device address)
            found = exported.get(id(buffer))
            if found is None:
                found = exported[id(buffer)] = self._exported(buffer)
            export, start = found
            export.mapped_by.add(peer)
        retired = self.retiring.get(peer, [])
        told, self.retiring[peer] = retired[:RETIRED_PER_HEADER], retired[RETIRED_PER_HEADER:]
        told += [-1] * (RETIRED_PER_HEADER - len(told))
        self.stats["headers"] += 1
        if export is None:
            return np.frombuffer(HEADER.pack(HEADER_KIND, -1, 0, 0, 0, *told, b""), np.uint8)
        return np.frombuffer(HEADER.pack(HEADER_KIND, export.key, export.allocation.size,
                                         start + elements.start * buffer.itemsize, nbytes, *told, export.handle),
                             np.uint8)

    def _exported(self, array) -> tuple[Export, int]:
        try:
            allocation, offset = self.layer.allocation(array)
            export = self.exports.get(allocation.base)
            if export is not None and export.allocation == allocation:
                return export, offset
            handle = self.layer.export(allocation)
        except Exception as error:
            raise RuntimeError(f"ringtree: rank {self.comm.Get_rank()} cannot share this device memory with the ranks "
                               f"of its node ({self.layer.name} IPC: {error}); RINGTREE_TRANSPORT=staged sends it "
                               "through host memory instead") from None
        for old in [e for e in self.exports.values() if _overlap(e.allocation, allocation)]:
            self._retire(old)  # freed: a new allocation took its memory
        if len(self.exports) >= MAX_EXPORTS:
            self._retire(next(iter(self.exports.values())))
        export = Export(self.next_key, allocation, handle, set())
        self.next_key += 1
        self.exports[allocation.base] = export
        self.stats["exported"] += 1
        return export, offset

    def _retire(self, export: Export) -> None:
        del self.exports[export.allocation.base]
        for peer in export.mapped_by:
            self.retiring.setdefault(peer, []).append(export.key)
        self.stats["retired"] += 1

    def source(self, peer: int, header: bytes, dtype: np.dtype):
        """The peer's region a header names, as an array of `dtype` (None where it is empty), and its
        size in bytes; closes what the header retires."""
        _, key, size, offset, nbytes, *rest = HEADER.unpack(header)
        retired, handle = rest[:RETIRED_PER_HEADER], rest[RETIRED_PER_HEADER]
        for gone in retired:
            mapped = self.mapped.pop((peer, gone), None) if gone >= 0 else None
            if mapped is not None:
                self.layer.close(mapped)
                self.stats["closed"] += 1
        if key < 0:
            return None, nbytes
        mapped = self.mapped.get((peer, key))
        if mapped is None:
            try:
                mapped = self.mapped[peer, key] = self.layer.open(handle, size)
            except Exception as error:
                raise RuntimeError(f"ringtree: rank {self.comm.Get_rank()} cannot map rank {peer}'s device memory "
                                   f"({self.layer.name} IPC: {error}); RINGTREE_TRANSPORT=staged sends it through "
                                   "host memory instead") from None
            self.stats["opened"] += 1
        return mapped[offset:offset + nbytes].view(dtype), nbytes

    def message(self, execution, send: bool, peer: int, buffer, elements: slice):
        return ipc_message(execution, send, peer, buffer, elements)

    def ack(self, peer: int, tag: int) -> None:
        self.acks = [request for request in self.acks if not request.Test()]
        self.acks.append(self.comm.Isend([ACK, BYTE], peer, tag))

    def close(self) -> None:
        """Unmap everything mapped (the communicator is freed)."""
        for mapped in self.mapped.values():
            self.layer.close(mapped)
        self.mapped.clear()


def _overlap(a: Allocation, b: Allocation) -> bool:
    return a.base < b.base + b.size and b.base < a.base + a.size


class Channel:
    """Headers and acks between this rank and one peer in one call: what arrived, in the peer's order."""

    __slots__ = ("transport", "peer", "tag", "posted", "headers", "acked", "sends", "last_receive")

    def __init__(self, transport: IpcTransport, peer: int, tag: int, messages: int) -> None:
        """`messages`: how many the peer sends this rank in the call (its headers and acks)."""
        self.transport, self.peer, self.tag = transport, peer, tag
        comm = transport.comm
        self.posted: deque = deque()  # (request, buffer, status), in posting order
        for _ in range(messages):
            buffer = np.empty(MESSAGE, np.uint8)
            self.posted.append((comm.Irecv([buffer, BYTE], peer, tag), buffer, MPI.Status()))
        self.headers: deque = deque()  # headers arrived and not yet taken
        self.acked = 0  # acks arrived
        self.sends = 0  # Sendings made on it
        self.last_receive = None  # the latest Receiving on it, which the next one acks after

    def progress(self) -> None:
        posted = self.posted
        while posted:
            try:
                if not posted[0][0].Test(posted[0][2]):
                    return
            except MPI.Exception:  # larger than any header: MPI truncated it
                raise MessageError(self.peer, None) from None
            _, buffer, status = posted.popleft()
            size = status.Get_count(BYTE)
            kind = struct.unpack_from("<q", buffer)[0] if size >= 8 else 0
            if kind == HEADER_KIND and size == MESSAGE:
                self.headers.append(buffer.tobytes())
            elif kind == ACK_KIND and size == ACK.size:
                self.acked += 1
            else:
                raise MessageError(self.peer, size)

    def cancel(self) -> None:
        for request, _, _ in self.posted:
            try:
                request.Cancel()
                request.Wait()
            except MPI.Exception:
                pass
        self.posted.clear()


class MessageError(Exception):
    """A message between IPC peers that is neither a header nor an ack: the peer does not use IPC here."""

    def __init__(self, peer: int, size: int | None) -> None:
        super().__init__(peer, size)
        self.peer, self.size = peer, size


class Sending:
    """A SEND by IPC: the header goes at once; done when the peer's ack for it has come."""

    __slots__ = ("channel", "number", "header", "request")

    def __init__(self, channel: Channel, buffer, elements: slice, exported: dict) -> None:
        self.channel, self.number = channel, channel.sends
        channel.sends += 1
        self.header = channel.transport.header(buffer, elements, channel.peer, exported)
        self.request = channel.transport.comm.Isend([self.header, BYTE], channel.peer, channel.tag)

    @property
    def done(self) -> bool:
        self.channel.progress()
        return self.channel.acked > self.number and self.request.Test()

    def cancel(self) -> None:
        self.channel.cancel()
        try:
            self.request.Free()
        except MPI.Exception:
            pass


class Receiving:
    """A RECV by IPC: wait for the header, copy the region out of the peer's memory, ack."""

    __slots__ = ("channel", "target", "copy", "queued", "previous", "finished")

    def __init__(self, channel: Channel, target, copy) -> None:
        self.channel, self.target, self.copy = channel, target, copy
        self.queued = False  # the copy has been issued; its event, if the copy is asynchronous
        self.previous, channel.last_receive = channel.last_receive, self
        self.finished = False

    @property
    def done(self) -> bool:
        if self.finished:
            return True
        channel = self.channel
        if self.queued is False:
            channel.progress()
            if not channel.headers or (self.previous is not None and self.previous.queued is False):
                return False
            source, nbytes = channel.transport.source(channel.peer, channel.headers.popleft(), self.target.dtype)
            if nbytes != self.target.nbytes:
                raise WrongSize(channel.peer, nbytes, self.target.nbytes)
            self.queued = None if source is None else self.copy(self.target, source)
        if self.queued is not None and not self.queued.done:
            return False
        if self.previous is not None and not self.previous.done:
            return False  # acks answer sends in order
        channel.transport.ack(channel.peer, channel.tag)
        self.finished, self.previous = True, None
        return True

    def cancel(self) -> None:
        self.channel.cancel()


def ipc_message(execution, send: bool, peer: int, buffer, elements: slice):
    """A SEND (`send`) or RECV of `execution` (pipelined.py) with an IPC peer, as work the engine polls."""
    channel = execution.channels.get(peer)
    if channel is None:
        messages = execution.compiled.messages[peer]
        channel = execution.channels[peer] = Channel(execution.transport, peer, execution.tag, messages)
    if send:
        return Sending(channel, buffer, elements, execution.exported)
    return Receiving(channel, buffer[elements], execution.copy)


class WrongSize(Exception):
    def __init__(self, peer: int, got: int, expected: int) -> None:
        super().__init__(peer, got, expected)
        self.peer, self.got, self.expected = peer, got, expected


def mismatch(error: WrongSize | MessageError) -> str:
    """What a message between IPC peers that does not fit says about the ranks."""
    if isinstance(error, WrongSize):
        return f"rank {error.peer} offers {error.got} bytes of device memory where this rank expects {error.expected}"
    return (f"a message from rank {error.peer} is not the IPC header or ack this rank expects: does it pass host "
            "arrays where this rank passes device arrays?")


class CudaLayer:
    """CUDA IPC through CuPy, with the allocation's range and identity from the driver."""

    name = "CUDA"
    BUFFER_ID, IPC_CAPABLE, RANGE_START, RANGE_SIZE = 7, 10, 11, 12  # CUpointer_attribute
    LAZY_ENABLE_PEER_ACCESS = 1

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy
        self.driver = ctypes.CDLL("libcuda.so.1")
        self.driver.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
        # handle -> [mapped array, users]: a process maps a handle once (CUDA refuses a second open)
        self.opened: dict[bytes, list] = {}

    def _attribute(self, kind: int, pointer: int) -> int:
        value = ctypes.c_uint64(0)
        result = self.driver.cuPointerGetAttribute(ctypes.byref(value), kind, pointer)
        if result != 0:
            raise RuntimeError(f"cuPointerGetAttribute({kind}) failed with CUresult {result}")
        return value.value

    def allocation(self, array) -> tuple[Allocation, int]:
        pointer = array.data.ptr
        if not self._attribute(self.IPC_CAPABLE, pointer):
            raise ValueError("the memory is not cudaMalloc's (a stream-ordered or managed pool?), which CUDA IPC "
                             "cannot share")
        base = self._attribute(self.RANGE_START, pointer)
        found = Allocation(base, self._attribute(self.RANGE_SIZE, pointer), self._attribute(self.BUFFER_ID, pointer))
        return found, pointer - base

    def export(self, allocation: Allocation) -> bytes:
        return bytes(self.cupy.cuda.runtime.ipcGetMemHandle(allocation.base))

    def open(self, handle: bytes, size: int):
        found = self.opened.get(handle)
        if found is None:
            cupy = self.cupy
            pointer = cupy.cuda.runtime.ipcOpenMemHandle(handle, self.LAZY_ENABLE_PEER_ACCESS)
            memory = cupy.cuda.UnownedMemory(pointer, size, self, cupy.cuda.Device().id)
            found = self.opened[handle] = [cupy.ndarray((size,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0)), 0]
        found[1] += 1
        return found[0]

    def close(self, mapped) -> None:
        handle = next((h for h, (array, _) in self.opened.items() if array is mapped), None)
        if handle is None:
            return
        self.opened[handle][1] -= 1
        if self.opened[handle][1] > 0:
            return
        del self.opened[handle]
        try:
            self.cupy.cuda.runtime.deviceSynchronize()  # a copy out of it may still run (rare: once per freed allocation)
            self.cupy.cuda.runtime.ipcCloseMemHandle(mapped.data.ptr)
        except self.cupy.cuda.runtime.CUDARuntimeError as error:
            log.warning("ringtree: closing a peer's device memory failed: %s", error)
