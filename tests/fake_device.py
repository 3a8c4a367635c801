"""A device without a GPU, for testing the IPC transport under mpiexec.

Each rank's "device memory" is one arena of POSIX shared memory that the other
ranks of its host can map by name. `device_empty` carves allocations out of it,
first fit, and `device_free` gives them back, so a new allocation may take a freed
one's address, as cudaMalloc may: what the transport's registration cache must
see through. Reductions and copies of device arrays run later, in order, on one
worker thread, as on a CUDA stream, and hand back an event whose `done` turns true
once they have run: whatever reads their result too early reads stale data.

`register()` makes ringtree take these arrays (a numpy subclass, `DeviceArray`)
through `FakeDevice`, a backend whose MPI cannot take device memory (staged) and
whose IPC layer is `SharedMemoryLayer`.
"""

from __future__ import annotations

import atexit
import itertools
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from ringtree.runtime.transports import backend as backends
from ringtree.runtime.transports.backend import NumpyBackend
from ringtree.runtime.transports.ipc import HANDLE_BYTES, Allocation

ARENA_BYTES = 32 << 20  # sparse, but CI machines may give /dev/shm little room
ALIGN = 256
_STREAM = ThreadPoolExecutor(1)
_identities = itertools.count(1)


class DeviceArray(np.ndarray):
    """An array in this rank's fake device memory."""


class _Arena:
    def __init__(self) -> None:
        self.memory = shared_memory.SharedMemory(create=True, size=ARENA_BYTES)
        self.bytes = np.ndarray(ARENA_BYTES, np.uint8, buffer=self.memory.buf)
        self.base = self.bytes.__array_interface__["data"][0]
        self.free = [(0, ARENA_BYTES)]  # (offset, size), by offset
        self.live: dict[int, Allocation] = {}  # offset -> allocation

    def allocate(self, nbytes: int) -> int:
        nbytes = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        for k, (offset, size) in enumerate(self.free):
            if size >= nbytes:
                self.free[k] = (offset + nbytes, size - nbytes)
                self.live[offset] = Allocation(self.base + offset, nbytes, next(_identities))
                return offset
        raise MemoryError("the fake device's arena is full")

    def release(self, offset: int) -> None:
        allocation = self.live.pop(offset)
        self.free.append((offset, allocation.size))
        self.free.sort()
        merged = []
        for start, size in self.free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((start, size))
        self.free = merged

    def unlink(self) -> None:
        self.memory.unlink()


_arena: _Arena | None = None


def arena() -> _Arena:
    global _arena
    if _arena is None:
        _arena = _Arena()
        atexit.register(_arena.unlink)
    return _arena


def device_empty(count: int, dtype) -> DeviceArray:
    dtype = np.dtype(dtype)
    a = arena()
    offset = a.allocate(count * dtype.itemsize)
    return a.bytes[offset:offset + count * dtype.itemsize].view(dtype).view(DeviceArray)


def device_array(values) -> DeviceArray:
    values = np.asarray(values)
    array = device_empty(values.size, values.dtype).reshape(values.shape)
    array[...] = values
    return array


def device_free(array: DeviceArray) -> None:
    """Give `array`'s allocation back: a later one may take its address (its data stays as it was)."""
    a = arena()
    a.release(array.__array_interface__["data"][0] - a.base)


class _Event:
    def __init__(self, future) -> None:
        self.future = future

    @property
    def done(self) -> bool:
        return self.future.done()


def _queued(work, *args) -> _Event:
    def run():
        time.sleep(1e-4)  # long enough that anything started before the work finished reads stale data
        work(*args)
    return _Event(_STREAM.submit(run))


def synchronize() -> None:
    _STREAM.submit(lambda: None).result()


class SharedMemoryLayer:
    """IPC over the arenas: a handle names the peer's arena and the allocation in it."""

    name = "shared-memory"
    HANDLE = struct.Struct("<qq40s")  # offset, identity, arena name

    def __init__(self) -> None:
        self.attached: dict[str, shared_memory.SharedMemory] = {}

    def allocation(self, array) -> tuple[Allocation, int]:
        a = arena()
        pointer = array.__array_interface__["data"][0]
        for allocation in a.live.values():
            if allocation.base <= pointer < allocation.base + max(allocation.size, 1):
                return allocation, pointer - allocation.base
        raise ValueError("not in this rank's fake device memory")

    def export(self, allocation: Allocation) -> bytes:
        a = arena()
        handle = self.HANDLE.pack(allocation.base - a.base, allocation.identity, a.memory.name.encode())
        assert len(handle) <= HANDLE_BYTES
        return handle.ljust(HANDLE_BYTES, b"\0")

    def open(self, handle: bytes, size: int):
        offset, _, name = self.HANDLE.unpack(handle[:self.HANDLE.size])
        name = name.rstrip(b"\0").decode()
        memory = self.attached.get(name)
        if memory is None:
            memory = self.attached[name] = shared_memory.SharedMemory(name=name)
            resource_tracker.unregister(memory._name, "shared_memory")  # its creator unlinks it
        return np.ndarray(size, np.uint8, buffer=memory.buf, offset=offset).view(DeviceArray)

    def close(self, mapped) -> None:
        """Nothing to undo: the arena stays attached for the next mapping of it."""


class FakeDevice(NumpyBackend):
    """DeviceArrays: staged for MPI, IPC between ranks of a host, work queued as on a stream."""

    device = True
    staged = True
    asynchronous = True
    ipc = SharedMemoryLayer()

    @staticmethod
    def owns(array) -> bool:
        return isinstance(array, DeviceArray)

    @staticmethod
    def empty(count: int, dtype) -> DeviceArray:
        return device_empty(count, dtype)

    @staticmethod
    def empty_like(array) -> DeviceArray:
        return device_empty(array.size, array.dtype).reshape(array.shape)

    @staticmethod
    def host_empty(count: int, dtype) -> np.ndarray:
        return np.empty(count, dtype)

    @staticmethod
    def reducer(op):
        ufunc = NumpyBackend.reducer(op)
        return lambda left, right, out: _queued(ufunc, left, right, out)

    @staticmethod
    def copy(dst, src) -> _Event:
        return _queued(np.copyto, dst, src)

    @staticmethod
    def divide(output, nranks: int) -> None:
        synchronize()
        np.true_divide(output, nranks, out=output)

    @staticmethod
    def current_stream():
        return None

    @staticmethod
    def to_host(array) -> np.ndarray:
        synchronize()
        return np.array(array, copy=True).view(np.ndarray)

    @staticmethod
    def to_device(host, array, stream) -> None:
        np.copyto(array, host)


def register() -> None:
    backends.register(FakeDevice)
