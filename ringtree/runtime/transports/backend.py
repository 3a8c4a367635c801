"""The array backends: the one place that knows how to allocate, reduce and copy buffers.

NumpyBackend handles numpy arrays; CupyBackend CuPy arrays on the current CUDA
device, direct to a CUDA-aware MPI or staged through pinned host memory
(schedule/staging.py) for any other. Both are a `Backend`.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ... import settings
from ...debug import log
from ...ops import ReduceOp

__all__ = ["Backend", "NumpyBackend", "CupyBackend", "NoDevice", "backend_for", "cupy_backend", "register"]

Reduce = Callable[[Any, Any, Any], Any]  # (left, right, out): out <- left (+) right


class Backend(Protocol):
    """What the library asks of an array library."""

    staged: bool  # messages go through host memory: the MPI cannot take these arrays
    asynchronous: bool  # reductions and copies may return before they finish (runtime/engine/pipelined.py)
    device: bool  # the arrays are in device memory
    ipc: object  # the device layer ranks of one node map each other's memory with (runtime/transports/ipc.py), or None

    def owns(self, array) -> bool: ...

    def check(self, array, name: str, op: ReduceOp) -> None:
        """Raise TypeError or ValueError for an array this backend cannot reduce with `op`."""

    def writeable(self, array) -> bool: ...

    def empty_like(self, array): ...

    def empty(self, count: int, dtype: np.dtype): ...

    def host_empty(self, count: int, dtype: np.dtype) -> np.ndarray:
        """Scratch in host memory, for a staged schedule's host buffers."""

    def reducer(self, op: ReduceOp) -> Reduce: ...

    def bind(self, reduce: Reduce, shared: bool = False) -> tuple[Callable, Callable, Callable]:
        """(reduce, copy, divide) for one call started now; `shared`: other ranks read its memory themselves
        (IPC), so what the caller queued before the call must have finished."""

    def aliasing(self, a, b) -> str | None:
        """None if a and b are apart in memory, "same" if they are one region, else "overlap"."""

    # Staged backends only: a whole call's data through host memory (allreduce's small staged calls).
    def to_host(self, array) -> np.ndarray: ...

    def to_device(self, host: np.ndarray, array, stream) -> None: ...

    def current_stream(self): ...


def _minimum(left, right, out):
    np.minimum(left, right, out=out)  # numpy 2.4 deprecates a positional out for minimum and maximum


def _maximum(left, right, out):
    np.maximum(left, right, out=out)


_UFUNCS = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: _minimum, ReduceOp.MAX: _maximum,
    ReduceOp.LAND: np.logical_and, ReduceOp.LOR: np.logical_or, ReduceOp.LXOR: np.logical_xor,
    ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}


class NumpyBackend:
    """numpy arrays on the host."""

    staged = False  # MPI takes these arrays as they are
    asynchronous = False  # reductions and copies have finished when they return
    device = False
    ipc = None  # host memory goes through MPI, which shares it between ranks of a node itself

    @staticmethod
    def owns(array) -> bool:
        return isinstance(array, np.ndarray)

    @staticmethod
    def check(array, name: str, op: ReduceOp) -> None:
        """numpy reduces every dtype that ops.check_dtype lets through."""

    @staticmethod
    def writeable(array: np.ndarray) -> bool:
        return array.flags.writeable

    @classmethod
    def bind(cls, reduce, shared=False):
        """(reduce, copy, divide) for one call started now; on the host, the same for every call."""
        return reduce, cls.copy, cls.divide

    @staticmethod
    def empty_like(array: np.ndarray) -> np.ndarray:
        return np.empty_like(array)

    @staticmethod
    def empty(count: int, dtype: np.dtype) -> np.ndarray:
        return np.empty(count, dtype)

    host_empty = empty

    @staticmethod
    def reducer(op: ReduceOp):
        """A function (left, right, out) writing left (+) right into out, with no temporary: the ufunc
        itself where it takes out by position (a keyword costs a ufunc call about 0.4 µs)."""
        return _UFUNCS[op]

    @staticmethod
    def copy(dst, src) -> None:
        np.copyto(dst, src)

    @staticmethod
    def divide(output, nranks: int) -> None:
        np.true_divide(output, nranks, out=output)

    @staticmethod
    def aliasing(a, b) -> str | None:
        if a is b:
            return "same"
        if a.flags.owndata and b.flags.owndata:  # two allocations of numpy's own never overlap
            return None
        if not np.may_share_memory(a, b):
            return None
        if a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.nbytes == b.nbytes:
            return "same"
        return "overlap" if np.shares_memory(a, b) else None


class CupyBackend:
    """CuPy arrays on the current CUDA device.

    A call is ordered on the stream that is current when it starts, as NCCL's
    are on the stream they are given: its reductions and device copies go on
    that stream, wherever its later ops are issued from. Copies between host
    and device (staging) go on a stream of their own, after the work of the
    call's stream, so they overlap the reductions. Both hand the engine a CUDA
    event, and the engine starts what depends on the work once the event is
    done: a send after the copy or kernel that wrote its region, a reduction
    after the copy of its received data, the next message into a host slot
    after the copy that emptied it.

    `staged`: the MPI cannot take device memory, so the schedule stages every
    message through host slots, here pinned (page-locked) memory from CuPy's
    pinned pool. Else MPI reads and writes device memory itself: the call's
    stream is synchronised before the first message, so MPI reads finished data.
    Messages between ranks of one node go by CUDA IPC instead (`ipc`; runtime/transports/ipc.py),
    which also synchronises the stream first: the peer reads the memory itself.
    """

    asynchronous = True
    device = True

    def __init__(self, staged: bool) -> None:
        import cupy

        self.cupy = cupy
        self.staged = staged
        self.ufuncs = {
            ReduceOp.SUM: cupy.add, ReduceOp.AVG: cupy.add, ReduceOp.PROD: cupy.multiply,
            ReduceOp.MIN: cupy.minimum, ReduceOp.MAX: cupy.maximum,
            ReduceOp.LAND: cupy.logical_and, ReduceOp.LOR: cupy.logical_or, ReduceOp.LXOR: cupy.logical_xor,
            ReduceOp.BAND: cupy.bitwise_and, ReduceOp.BOR: cupy.bitwise_or, ReduceOp.BXOR: cupy.bitwise_xor,
        }
        self.copy_streams: dict[int, object] = {}  # device id -> the stream staging copies go on
        self.copying: deque = deque()  # (event, host array): copies to the device not known to be done
        self.reducible: set[tuple[ReduceOp, np.dtype]] = set()  # pairs check() has seen CuPy reduce
        self._ipc: object = False  # not looked for yet

    @property
    def ipc(self):
        """CUDA's IPC layer, or None where the driver lacks what it needs (said once, RINGTREE_DEBUG=1)."""
        if self._ipc is False:
            from .ipc import CudaLayer

            try:
                self._ipc = CudaLayer()
            except (OSError, AttributeError) as error:
                log.info("no CUDA IPC between ranks of a node: %s", error)
                self._ipc = None
        return self._ipc

    def owns(self, array) -> bool:
        return isinstance(array, self.cupy.ndarray)

    def check(self, array, name: str, op: ReduceOp) -> None:
        """Raise ValueError unless `array` is on the current device, TypeError unless CuPy reduces its
        dtype with `op` (tried once per pair, on one element, before any message)."""
        current = self.cupy.cuda.Device().id
        if array.device.id != current:
            raise ValueError(f"{name} is on device {array.device.id} but the current device is {current}: "
                             f"call under `with cupy.cuda.Device({array.device.id}):`")
        if (op, array.dtype) not in self.reducible:
            try:
                one = self.cupy.zeros(1, array.dtype)
                self.ufuncs[op](one, one, out=one)
            except Exception as error:
                raise TypeError(f"CuPy cannot reduce {array.dtype} with {op.value}: {error}") from None
            self.reducible.add((op, array.dtype))

    @staticmethod
    def writeable(array) -> bool:
        return True  # CuPy has no read-only arrays

    def empty_like(self, array):
        return self.cupy.empty_like(array)

    def empty(self, count: int, dtype: np.dtype):
        return self.cupy.empty(count, dtype)

    def host_empty(self, count: int, dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        memory = self.cupy.cuda.alloc_pinned_memory(max(1, count) * dtype.itemsize)
        return np.frombuffer(memory, dtype, count)

    def reducer(self, op: ReduceOp):
        return self.ufuncs[op]  # bind() puts it on a call's stream

    def current_stream(self):
        return self.cupy.cuda.get_current_stream()

    def to_host(self, array) -> np.ndarray:
        """A pinned host copy of `array`, made after the work queued on the current stream."""
        host = self.host_empty(array.size, array.dtype)
        if array.size:
            array.get(out=host)  # on the current stream, and waits for it
        return host

    def to_device(self, host: np.ndarray, array, stream) -> None:
        """Queue the copy of `host` into `array` on `stream`; `host` is kept until the copy is done."""
        while self.copying and self.copying[0][0].done:
            self.copying.popleft()  # its pinned memory goes back to CuPy's pool
        if array.size:
            array.set(host, stream=stream)
            self.copying.append((self._recorded(stream), host))

    def bind(self, ufunc, shared=False):
        """(reduce, copy, divide) for one call, on the stream current now."""
        cupy, recorded = self.cupy, self._recorded
        stream = cupy.cuda.get_current_stream()
        transfers = self._copy_stream()
        if self.staged and not shared:
            transfers.wait_event(recorded(stream))  # the caller's work on its input comes first
        else:
            stream.synchronize()  # MPI reads the input itself

        def reduce(left, right, out):
            with stream:
                ufunc(left, right, out=out)
            return recorded(stream)

        def copy(dst, src):
            if type(dst) is not np.ndarray and type(src) is not np.ndarray:
                with stream:
                    cupy.copyto(dst, src)
                return recorded(stream)
            transfers.wait_event(recorded(stream))  # after the kernels that wrote src, or still read dst
            if type(dst) is np.ndarray:
                src.get(stream=transfers, out=dst, blocking=False)
            else:
                dst.set(src, stream=transfers)
            return recorded(transfers)

        def divide(output, nranks: int) -> None:
            with stream:
                cupy.true_divide(output, nranks, out=output)

        return reduce, copy, divide

    @staticmethod
    def aliasing(a, b) -> str | None:
        """As NumpyBackend.aliasing, for C-contiguous device arrays."""
        if a is b or (a.data.ptr == b.data.ptr and a.nbytes == b.nbytes):
            return "same"
        overlap = a.data.ptr < b.data.ptr + b.nbytes and b.data.ptr < a.data.ptr + a.nbytes
        return "overlap" if overlap else None

    def _copy_stream(self):
        device = self.cupy.cuda.Device().id
        stream = self.copy_streams.get(device)
        if stream is None:
            stream = self.copy_streams[device] = self.cupy.cuda.Stream(non_blocking=True)
        return stream

    def _recorded(self, stream):
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        return event


class NoDevice(RuntimeError):
    """A CuPy array was given, but CuPy finds no usable CUDA device."""


@functools.cache
def cupy_backend() -> CupyBackend:
    """The backend for CuPy arrays in this process: direct or staged as the MPI allows (cuda.py)."""
    import cupy

    from .cuda import cuda_support

    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise NoDevice(f"the arrays are CuPy arrays, but CUDA finds no usable device ({error})") from None
    if devices == 0:
        raise NoDevice("the arrays are CuPy arrays, but CUDA finds no device")
    transport = settings.current().transport
    staged = {"staged": True, "direct": False}.get(transport, not cuda_support().aware)
    log.info("CuPy arrays go %s (between ranks of a node, by CUDA IPC where it works: RINGTREE_TRANSPORT=%s)",
             "through pinned host memory (staged)" if staged else "to MPI directly", transport)
    return CupyBackend(staged)


# Backends of other array libraries, asked before numpy's (whose arrays theirs may subclass): `register`.
REGISTERED: list = []


def register(backend) -> None:
    """Let ringtree take the arrays `backend` owns (a `Backend`), before numpy's and CuPy's."""
    if backend not in REGISTERED:
        REGISTERED.append(backend)


def backend_for(array):
    """The backend that handles `array`, or None. CuPy is imported only when an array is CuPy's."""
    if type(array) is np.ndarray:
        return NumpyBackend
    for backend in REGISTERED:
        if backend.owns(array):
            return backend
    if NumpyBackend.owns(array):
        return NumpyBackend
    if type(array).__module__.split(".")[0] == "cupy":
        backend = cupy_backend()
        if backend.owns(array):
            return backend
    return None
