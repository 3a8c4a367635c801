"""What mpi4py takes as a buffer, as the array ringtree reduces, by mpi4py's own rules (its msgbuffer.pxi):
`None` and `MPI.IN_PLACE`, arrays, the buffer protocol, DLPack, the CUDA array interface, torch
tensors, and buffer specifications of any of these with a count, a displacement and a datatype.

A C- or Fortran-contiguous buffer becomes a 1-D view of its memory, in memory order, as MPI sees it:
the result lands in the caller's own memory. Nothing here copies data or sends a message.
"""

from __future__ import annotations

import ctypes.util
import functools
from contextlib import nullcontext
from typing import NamedTuple

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from .. import tensors
from ..ops import op_name, parse_op
from ..runtime.transports.backend import REGISTERED, NoDevice, backend_for, cupy_backend
from ..tensors import is_tensor
from ..words import counted

__all__ = ["Converted", "converted", "as_array", "is_plain_call", "passes_through", "datatype_name"]


class Converted(NamedTuple):
    """A call's buffers as ringtree's arrays, and what the call returns."""

    send: object  # an array, or MPI.IN_PLACE
    recv: object  # an array, or None for a new one
    result: object  # what allreduce returns: the caller's recvbuf, a new tensor, or None (the new array)
    context: object  # entered around the call: a CUDA tensor's is torch's current stream


def is_plain_call(sendbuf, recvbuf) -> bool:
    """Whether the buffers are already what allreduce's checks take: C-contiguous numpy or CuPy arrays
    (or IN_PLACE, None) and nothing to convert."""
    return ((sendbuf is MPI.IN_PLACE or _plain(sendbuf)) and (recvbuf is None or _plain(recvbuf)))


def _plain(buf) -> bool:
    if type(buf) is np.ndarray:
        return buf.flags.c_contiguous
    # CuPy's arrays, and those of a registered backend: allreduce's own checks and messages apply
    return type(buf).__module__.split(".")[0] == "cupy" or any(backend.owns(buf) for backend in REGISTERED)


def converted(sendbuf, recvbuf) -> Converted:
    """The call's buffers as arrays; `None` for sendbuf is MPI.IN_PLACE, as in mpi4py. Raises
    TypeError or ValueError (without the rank: the caller adds it)."""
    if sendbuf is None:
        sendbuf = MPI.IN_PLACE
    recv = None if recvbuf is None else as_array(recvbuf, "recvbuf", writable=True)
    send = MPI.IN_PLACE if sendbuf is MPI.IN_PLACE else as_array(sendbuf, "sendbuf", writable=False)
    if send is not MPI.IN_PLACE and recv is not None:
        if send.size != recv.size:
            raise ValueError(f"sendbuf has {counted(send.size, 'element')} but recvbuf has {recv.size}")
        if send.dtype != recv.dtype:
            raise TypeError(f"sendbuf has dtype {send.dtype} but recvbuf has dtype {recv.dtype}")
    result, context = recvbuf, nullcontext()
    given = _buffer_of(recvbuf if recvbuf is not None else sendbuf)
    if is_tensor(given):
        context = tensors.stream_of(given)
    if recvbuf is None and send is not MPI.IN_PLACE and not isinstance(sendbuf, (list, tuple)):
        # The result has the type, shape and order it was given.
        if is_tensor(given):
            result = tensors.new_like(given)
            recv = _flat(tensors.as_array(result, "recvbuf"), "recvbuf")
        elif isinstance(given, np.ndarray):
            result = np.empty_like(given, subok=False)
            recv = _flat(result, "recvbuf")
    return Converted(send, recv, result, context)


def _buffer_of(spec):
    return spec[0] if isinstance(spec, (list, tuple)) else spec


def as_array(spec, name: str, *, writable: bool):
    """A 1-D numpy or CuPy view of the memory a buffer specification names (or, for a CuPy array, the
    array itself). Specifications: `buf`, `[buf, datatype]`, `[buf, count]`, `[buf, count, datatype]`,
    `[buf, (count, displ), datatype]`, `[buf, count, displ, datatype]`, as lists or tuples, where
    datatype is a predefined MPI.Datatype or one of mpi4py's typecodes."""
    count = displ = datatype = None
    if isinstance(spec, (list, tuple)):
        if not 2 <= len(spec) <= 4:
            raise TypeError(f"{name}: a buffer specification has 2 to 4 items, got {len(spec)}")
        buf, *rest = spec
        if rest and (isinstance(rest[-1], (str, MPI.Datatype))):
            datatype = rest.pop()
        if len(rest) == 2:
            count, displ = rest
        elif rest:
            count, displ = rest[0] if isinstance(rest[0], tuple) else (rest[0], None)
    else:
        buf = spec
    try:
        array = _memory(buf, name, writable, typed=datatype is not None)
    except TypeError:
        if buf is spec:
            raise
        raise TypeError(f"{name}: expected a buffer, an array or a buffer specification [buf, ...], got a "
                        f"{type(spec).__name__} whose first item is a {type(buf).__name__}") from None
    if type(array).__module__.split(".")[0] == "cupy" and datatype is count is displ is None:
        return array
    if datatype is not None:
        dtype = numpy_dtype(datatype)
        if dtype != array.dtype:
            if array.nbytes % dtype.itemsize:
                raise ValueError(f"{name}: {array.nbytes} bytes is not a whole number of {datatype_name(datatype)}")
            array = array.view(np.uint8).view(dtype)
    displ = 0 if displ is None else displ
    count = array.size - displ if count is None else count
    if displ < 0 or count < 0 or displ + count > array.size:
        raise ValueError(f"{name}: count {count} at displacement {displ} does not fit a buffer of {array.size} "
                         "elements")
    return array[displ:displ + count]


def _memory(buf, name: str, writable: bool, typed: bool = False):
    """`buf`'s memory as a 1-D array in memory order (a CuPy array stays as it is). What is neither
    numpy's, CuPy's nor a tensor is read as mpi4py reads it: the buffer protocol, else DLPack, else
    the CUDA array interface. `typed`: a datatype will say what the elements are (bytes will do)."""
    if buf is MPI.IN_PLACE or buf is MPI.BOTTOM:  # both export an empty buffer
        raise TypeError(f"{name} cannot be MPI.{'IN_PLACE' if buf is MPI.IN_PLACE else 'BOTTOM'}"
                        + (" (only sendbuf can)" if buf is MPI.IN_PLACE else ""))
    if isinstance(buf, np.ndarray):
        return _flat(buf, name)
    backend = backend_for(buf)
    if backend is not None:  # CuPy's arrays: allreduce checks them
        return buf
    if is_tensor(buf):
        return _flat(tensors.as_array(buf, name), name)
    try:
        view = memoryview(buf)
    except TypeError:
        return _exported(buf, name, writable, typed)
    if not (view.c_contiguous or view.f_contiguous):
        raise ValueError(f"{name}: the buffer is not contiguous")
    if writable and view.readonly:
        raise ValueError(f"{name} is read-only")
    try:
        array = np.asarray(view)
    except (TypeError, ValueError):
        array = np.frombuffer(view.cast("B"), np.uint8)  # a format numpy cannot read: a datatype must say
    return _flat(array, name)


@functools.cache
def _cuda_driver() -> bool:
    """Whether this machine has a CUDA driver (find_library runs ldconfig: asked once)."""
    return ctypes.util.find_library("cuda") is not None


# DLPack's devices whose memory the host reads: the CPU's, and host memory pinned for CUDA or ROCm.
_HOST_DEVICES = (1, 3, 11)  # kDLCPU, kDLCUDAHost, kDLROCMHost


def _exported(buf, name: str, writable: bool, typed: bool):
    """The memory of an object that exports DLPack or the CUDA array interface: device memory as a
    CuPy array; host memory (a DLPack CPU tensor, or an interface whose pointer CUDA does not call
    device memory) as numpy's view of mpi4py's own buffer of it, which holds the export for as
    long as the view lives, writable wherever mpi4py would write (a legacy DLPack capsule says
    nothing of read-only, and mpi4py writes it)."""
    if hasattr(buf, "__dlpack__") and hasattr(buf, "__dlpack_device__"):
        if buf.__dlpack_device__()[0] not in _HOST_DEVICES:
            return _cupy(name, type(buf)).from_dlpack(buf)
        dtype = np.uint8 if typed else np.from_dlpack(buf).dtype  # numpy's reading of the element type
    elif hasattr(buf, "__cuda_array_interface__"):
        interface = buf.__cuda_array_interface__
        if _on_device(interface["data"][0], name, type(buf)):
            return _cupy(name, type(buf)).asarray(buf)
        dtype = np.dtype(interface["typestr"])
    else:
        raise TypeError(f"{name}: expected a buffer, an array or a buffer specification, got {type(buf).__name__}")
    try:
        memory = MPI.buffer.frombuffer(buf, readonly=not writable)
    except BufferError as error:
        if writable and ("writable" in str(error) or "read-only" in str(error)):
            raise ValueError(f"{name} is read-only") from None
        raise ValueError(f"{name}: {error}") from None
    if memory.nbytes % np.dtype(dtype).itemsize:
        raise ValueError(f"{name}: {memory.nbytes} bytes is not a whole number of {np.dtype(dtype).name}")
    return np.frombuffer(memory, dtype)


def _on_device(pointer, name: str, kind: type) -> bool:
    """Whether a CUDA array interface's pointer is device (or managed) memory, as CUDA says. Where
    CUDA has no device, or there is no CUDA at all, no memory is a device's; with a CUDA driver but
    no CuPy to ask it, that cannot be known: a TypeError."""
    if not pointer:
        return False
    try:
        import cupy
    except ImportError:
        if not _cuda_driver():
            return False
        raise TypeError(f"{name} is a {kind.__name__} with the CUDA array interface, which may be device memory: "
                        "that needs CuPy (pip install ringtree[cuda12] or ringtree[cuda13])") from None
    try:
        return cupy.cuda.runtime.pointerGetAttributes(pointer).type in (2, 3)  # device, managed
    except Exception:  # noqa: BLE001 - CUDA without a driver or a device: CuPy's errors of each
        return False


def _flat(array: np.ndarray, name: str) -> np.ndarray:
    if array.flags.c_contiguous:
        return array.reshape(-1)
    if array.flags.f_contiguous:
        return array.T.reshape(-1)  # the transpose of a Fortran-ordered array is C-ordered: a view
    raise ValueError(f"{name} is not contiguous in C or Fortran order (strides {array.strides} for shape "
                     f"{array.shape}); pass a contiguous copy, e.g. numpy.ascontiguousarray")


def _cupy(name: str, kind: type):
    """CuPy, for a buffer in device memory; a clear error where there is no CuPy or no device."""
    try:
        import cupy
    except ImportError:
        raise TypeError(f"{name} is a {kind.__name__} in device memory, which needs CuPy") from None
    try:
        cupy_backend()  # NoDevice where CUDA finds none
    except NoDevice:
        raise NoDevice(f"{name} is a {kind.__name__} in device memory, but CUDA finds no usable device") from None
    return cupy


def numpy_dtype(datatype) -> np.dtype:
    """The numpy dtype of a predefined MPI datatype or an mpi4py typecode."""
    unsupported = TypeError(f"unsupported datatype {datatype_name(datatype)}: ringtree reduces predefined MPI "
                            "datatypes of numbers and mpi4py's typecodes")
    if isinstance(datatype, str):
        datatype = MPI._typedict.get(datatype, datatype)  # mpi4py's typecodes: 'i', 'f8', 'Zd', ...
        if isinstance(datatype, str):
            raise unsupported
    if not datatype.is_predefined:
        raise unsupported
    try:
        dtype = dtlib.to_numpy_dtype(datatype)
    except (TypeError, ValueError, KeyError):
        raise unsupported from None
    if dtype.fields or dtype.subdtype:
        raise unsupported
    return dtype


def datatype_name(datatype) -> str:
    if isinstance(datatype, MPI.Datatype):
        return datatype.Get_name() or "a derived datatype"
    return repr(datatype)


# MPI's ops that no allreduce takes: parse_op's error, not MPI's.
NOT_FOR_ALLREDUCE = (MPI.OP_NULL, MPI.REPLACE, MPI.NO_OP)


# The pairs of a value and an index that MAXLOC and MINLOC reduce.
PAIRS = (MPI.FLOAT_INT, MPI.DOUBLE_INT, MPI.LONG_INT, MPI.TWOINT, MPI.SHORT_INT, MPI.LONG_DOUBLE_INT)


def passes_through(op, *specs) -> str | None:
    """Why MPI's own collective, not ringtree, must reduce a call (None: ringtree can): an op that
    ringtree does not compute (user-defined, MAXLOC, MINLOC, ...), or a datatype that is not a number.
    MAXLOC and MINLOC of anything but pairs is a TypeError, as no MPI reduces them."""
    if op is MPI.MAXLOC or op is MPI.MINLOC:
        given = [spec[-1] for spec in specs if isinstance(spec, (list, tuple)) and spec]
        if not any(datatype in PAIRS for datatype in given):
            raise TypeError(f"op {op_name(op)} reduces pairs of a value and an index: give the buffers with a pair "
                            "datatype, e.g. [buf, MPI.DOUBLE_INT] (MPI.FLOAT_INT, LONG_INT, TWOINT, SHORT_INT, "
                            "LONG_DOUBLE_INT)")
    if isinstance(op, MPI.Op) and op not in NOT_FOR_ALLREDUCE:
        try:
            parse_op(op)
        except ValueError:
            return f"op {op_name(op)}"
    for spec in specs:
        if isinstance(spec, (list, tuple)) and spec and isinstance(spec[-1], MPI.Datatype):
            try:
                numpy_dtype(spec[-1])
            except TypeError:
                return f"datatype {datatype_name(spec[-1])}"
    return None
