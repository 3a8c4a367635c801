"""The arguments of every collective's call, checked on the calling rank before any message is sent, by
mpi4py's rules for Allreduce, Reduce_scatter, Allgatherv, Bcast, Reduce and Alltoall: bad input raises TypeError or
ValueError naming the rank and leaves the buffers untouched."""

from __future__ import annotations

import numbers
from functools import partial
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from .. import settings, tensors
from ..ops import ReduceOp, check_dtype, parse_op
from ..runtime.checks.refusal import refusing
from ..runtime.safety.mismatch import Signature
from ..runtime.safety.threads import note_thread
from ..runtime.session.counts import count_matrix
from ..runtime.session.state import comm_state, forget_waits_inside_mpi
from ..runtime.transports.backend import Backend, NoDevice, NumpyBackend, backend_for
from ..schedule.ir import ALLREDUCE, Collective, blocks
from ..tuning.online import NATIVE
from ..words import counted
from .buffers import as_array
from .checks import check_comm, check_options, checked_timeout

__all__ = ["Call", "checked", "checked_call", "prepared", "counts_of", "with_count_matrix"]


class Call(NamedTuple):
    """A collective call, prepared: its checked arguments (the checks below make these alone), then
    what it shares with the calls of its shape, its plan among it (call_path._shaped), then how it
    runs, bound to its arrays (call_path._bound). A session keeps calls bound to their arrays by
    their arguments (`repeats`) and, with no arrays, by their shape (`shapes`)."""

    collective: Collective
    count: int  # the schedule's: every block together
    source: object  # 1-D: the schedule's INPUT (empty for a broadcast)
    target: object  # 1-D: its OUTPUT (empty at a reduce's other ranks than the root)
    inplace: bool  # source lies in target where the schedule's input_at says
    backend: type[Backend]
    reduce_op: ReduceOp | None
    result: object  # what the call returns
    after: object  # None, or what to do once it is done (an in-place reduce-scatter's copy of its block)
    context: object  # None, or entered around the call: a CUDA tensor's is torch's current stream
    # Its shape's, once found:
    state: object = None  # its communicator's session
    signature: Signature | None = None
    plan: object = None
    what: object = None  # the call as a stall warning names it
    timeout: float | None = None
    comparison: tuple | None = None  # (record, call, what) for agreement.agree, where the ranks compare the call first
    trial: object = None  # the online tuning trial the call is (never kept), or None
    # Bound to its arrays:
    arguments: tuple = ()  # the caller's communicator and buffers, held so that their ids in its key stay theirs
    arrays: tuple = ()  # (array, dtype, written?) of the caller's numpy arrays: what may change in them in place
    native: object = None  # start(): MPI's own nonblocking collective of the call (native_start's, or showing_roots')
    run: object = None  # a function of none running the call blocking through its plan's MPI's own, or None
    steps: object = None  # for a plan the stepwise path may run: a function of none running it on the call's arrays


def checked_call(name: str, comm, algorithm, segment, check, *arguments) -> Call:
    """A call of collective `name` checked whole: its communicator and options (checks.py), then its
    buffers (prepared)."""
    check_comm(comm, name)
    check_options(name, comm, algorithm, segment, check)
    return prepared(name, comm, *arguments)


def prepared(name: str, comm, *arguments) -> Call:
    """The checked arguments of a call of collective `name`; TypeError or ValueError naming the rank."""
    try:
        return _CHECKS[name](comm.Get_rank(), comm.Get_size(), *arguments)
    except (TypeError, ValueError, NoDevice) as error:
        raise type(error)(f"ringtree {name} on rank {comm.Get_rank()}: {error}") from None


def _allreduce(rank, size, sendbuf, recvbuf, op) -> Call:
    """allreduce's arrays (numpy's or CuPy's, as allreduce passes them: buffer specifications and tensors
    come as arrays, buffers.converted_call)."""
    reduce_op = parse_op(op)
    if sendbuf is MPI.IN_PLACE:
        if recvbuf is None:
            raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold the input, but it is None")
        sendbuf = recvbuf
    backend = NumpyBackend if type(sendbuf) is np.ndarray else _array_backend(sendbuf, "sendbuf")
    if not sendbuf.flags.c_contiguous:
        raise _not_contiguous("sendbuf", sendbuf)
    check_dtype(sendbuf.dtype, reduce_op)
    backend.check(sendbuf, "sendbuf", reduce_op)
    inplace = recvbuf is sendbuf
    if recvbuf is None:
        recvbuf = backend.empty_like(sendbuf)
    else:
        if not inplace:
            if type(recvbuf) is not type(sendbuf) and _array_backend(recvbuf, "recvbuf") is not backend:
                raise TypeError(f"sendbuf is a {_type_name(sendbuf)} but recvbuf is a {_type_name(recvbuf)}")
            if not recvbuf.flags.c_contiguous:
                raise _not_contiguous("recvbuf", recvbuf)
            if recvbuf.dtype != sendbuf.dtype:
                raise TypeError(f"sendbuf has dtype {sendbuf.dtype} but recvbuf has dtype {recvbuf.dtype}")
            if recvbuf.size != sendbuf.size:  # as mpi4py: shapes may differ, the memory is what counts
                raise ValueError(f"sendbuf has {counted(sendbuf.size, 'element')} but recvbuf has {recvbuf.size}")
            backend.check(recvbuf, "recvbuf", reduce_op)
            aliasing = backend.aliasing(sendbuf, recvbuf) if sendbuf.size else None
            if aliasing == "overlap":
                raise ValueError("sendbuf and recvbuf overlap without being the same memory; use MPI.IN_PLACE")
            inplace = aliasing == "same"
        if not backend.writeable(recvbuf):
            raise ValueError("recvbuf is read-only")
    target = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
    source = target if inplace else sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)
    return Call(ALLREDUCE, target.size, source, target, inplace, backend, reduce_op, recvbuf, None, None)


def _reduce_scatter(rank, size, sendbuf, recvbuf, counts, op) -> Call:
    reduce_op = parse_op(op)
    inplace = sendbuf is MPI.IN_PLACE or sendbuf is None
    if inplace and recvbuf is None:
        raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold the input, but it is None")
    source = _array(recvbuf if inplace else sendbuf, "recvbuf" if inplace else "sendbuf", writable=inplace)
    backend = _backend(source, "sendbuf", reduce_op)
    counts = _counts(counts, size, source.size, "sendbuf")
    mine = counts[rank]
    after = None
    if inplace:  # the block goes to the start of recvbuf, where the input is still being read: by way of a copy
        target = backend.empty(mine, source.dtype)
        head = source[:mine]
        after, result = (lambda: head.__setitem__(Ellipsis, target)), recvbuf
    elif recvbuf is None:
        result = _new(sendbuf, backend, (mine,), source.dtype)
        target = _flat_of(result)
    else:
        target = _receiving(recvbuf, source, backend, reduce_op, mine, f"rank {rank}'s block")
        result = recvbuf
    return Call(Collective("reduce_scatter", counts), source.size, source, target, False, backend, reduce_op,
                result, after, _context(recvbuf if recvbuf is not None else sendbuf))


def _allgather(rank, size, sendbuf, recvbuf, counts) -> Call:
    inplace = sendbuf is MPI.IN_PLACE or sendbuf is None
    if inplace and recvbuf is None:
        raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold this rank's block, but it is None")
    if inplace:
        target = _array(recvbuf, "recvbuf", writable=True)
        backend = _backend(target, "recvbuf", None)
        counts = _counts(counts, size, target.size, "recvbuf")
        first, mine = blocks(counts)[rank]
        source, result = target[first:first + mine], recvbuf
    else:
        source = _array(sendbuf, "sendbuf", writable=False)
        backend = _backend(source, "sendbuf", None)
        stacked = counts is None  # a new recvbuf stacks the ranks' blocks: (ranks, *sendbuf.shape)
        counts = _counts((source.size,) * size if stacked else counts, size, None, "")
        if counts[rank] != source.size:
            raise ValueError(f"sendbuf has {counted(source.size, 'element')} but counts give rank {rank} {counts[rank]}")
        if recvbuf is None:
            shape = (size, *np.shape(sendbuf)) if stacked and _shaped(sendbuf) else (sum(counts),)
            result = _new(sendbuf, backend, shape, source.dtype)
            target = _flat_of(result)
        else:
            target, result = _receiving(recvbuf, source, backend, None, sum(counts), "every rank's block"), recvbuf
    return Call(Collective("allgather", counts), sum(counts), source, target, inplace, backend, None, result, None,
                _context(recvbuf if recvbuf is not None else sendbuf))


def _broadcast(rank, size, buf, root) -> Call:
    root = _root(root, size)
    target = _array(buf, "buf", writable=rank != root)
    backend = _backend(target, "buf", None)
    return Call(Collective("broadcast", (), root), target.size, target[:0], target, False, backend, None, buf, None,
                _context(buf))


def _reduce(rank, size, sendbuf, recvbuf, op, root) -> Call:
    reduce_op = parse_op(op)
    root = _root(root, size)
    inplace = sendbuf is MPI.IN_PLACE or sendbuf is None
    if inplace and rank != root:
        raise ValueError(f"sendbuf is MPI.IN_PLACE, which only the root (rank {root}) may give")
    if inplace and recvbuf is None:
        raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold the input, but it is None")
    source = _array(recvbuf if inplace else sendbuf, "recvbuf" if inplace else "sendbuf", writable=inplace)
    backend = _backend(source, "sendbuf", reduce_op)
    collective = Collective("reduce", (), root)
    if rank != root:  # its recvbuf, if any, is not looked at, as in MPI
        return Call(collective, source.size, source, source[:0], False, backend, reduce_op, None, None,
                    _context(sendbuf))
    if inplace:
        target, result = source, recvbuf
    elif recvbuf is None:
        result = _new(sendbuf, backend, np.shape(sendbuf) if _shaped(sendbuf) else (source.size,), source.dtype)
        target = _flat_of(result)
    else:
        target, result = _receiving(recvbuf, source, backend, reduce_op, source.size, "the result"), recvbuf
    return Call(collective, source.size, source, target, inplace, backend, reduce_op, result, None,
                _context(recvbuf if recvbuf is not None else sendbuf))


def _alltoall(rank, size, sendbuf, recvbuf, counts=None) -> Call:
    """An alltoall's arrays; `counts`: None for blocks alike, else the matrix the ranks' counts make
    (counts_of, then runtime/session/counts.py)."""
    inplace = sendbuf is MPI.IN_PLACE or sendbuf is None
    if inplace and recvbuf is None:
        raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold the input, but it is None")
    name = "recvbuf" if inplace else "sendbuf"
    source = _array(recvbuf if inplace else sendbuf, name, writable=inplace)
    backend = _backend(source, name, None)
    collective = Collective("alltoall", _counts(None, size, source.size, name) if counts is None else counts)
    sending, receiving = (sum(c for _, c in placed) for placed in collective.exchanged(rank))  # counts_of checked them
    if inplace:  # blocks are written where others are still to be read: the input is read from a copy
        target, result, source = source[:receiving], recvbuf, source[:sending].copy()
    elif recvbuf is None:
        shape = np.shape(sendbuf) if _shaped(sendbuf) and counts is None else (receiving,)
        result = _new(sendbuf, backend, shape, source.dtype)
        target = _flat_of(result)
    else:
        target, result = _receiving(recvbuf, source, backend, None, receiving, "every rank's block"), recvbuf
    if sending < source.size:  # counts that leave the end of sendbuf out
        source = source[:sending]
    return Call(collective, sum(collective.counts), source, target, False, backend, None, result, None,
                _context(recvbuf if recvbuf is not None else sendbuf))


def counts_of(comm, algorithm, segment, check, sendbuf, recvbuf, sendcounts,
              recvcounts) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(what this rank sends each rank, what it receives from each) of an alltoall given counts, its
    communicator, options and counts checked against its buffers (as checked_call checks a call);
    TypeError or ValueError naming the rank. In place, recvcounts are both."""
    check_comm(comm, "alltoall")
    check_options("alltoall", comm, algorithm, segment, check)
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        if algorithm == NATIVE:  # MPI's own alltoall is a candidate of blocks alike only (native_start)
            raise ValueError("algorithm 'native' (MPI's own) runs alltoalls of blocks alike, not counts given")
        inplace = sendbuf is MPI.IN_PLACE or sendbuf is None
        if inplace and recvbuf is None:
            raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold the input, but it is None")
        received = _named_counts(recvcounts, size, "recvcounts")
        sent = received if inplace else _named_counts(sendcounts, size, "sendcounts")
        for buffer, name, counts in ((recvbuf, "recvbuf", received), (None if inplace else sendbuf, "sendbuf", sent)):
            if buffer is None:
                continue
            elements = buffer.size if type(buffer) is np.ndarray else _array(buffer, name, writable=False).size
            if elements < sum(counts):
                raise ValueError(f"{name} has {counted(elements, 'element')}, too few for the {sum(counts)} its counts give")
    except (TypeError, ValueError) as error:
        raise type(error)(f"ringtree alltoall on rank {rank}: {error}") from None
    return sent, received


_CHECKS = {"allreduce": _allreduce, "reduce_scatter": _reduce_scatter, "allgather": _allgather, "broadcast": _broadcast,
           "reduce": _reduce, "alltoall": _alltoall}


def _array(spec, name: str, *, writable: bool):
    array = as_array(spec, name, writable=writable)
    if array.ndim != 1:  # a CuPy array comes as it is
        if not array.flags.c_contiguous:
            raise ValueError(f"{name} is not C-contiguous; pass a contiguous copy")
        array = array.reshape(-1)
    if writable and not (array.flags.writeable if isinstance(array, np.ndarray) else True):
        raise ValueError(f"{name} is read-only")
    return array


def _array_backend(buf, name):
    backend = backend_for(buf)
    if backend is None:
        raise TypeError(f"{name} must be a numpy or CuPy array, got {_type_name(buf)}")
    return backend


def _type_name(value) -> str:
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _not_contiguous(name, buf) -> ValueError:
    return ValueError(f"{name} is not C-contiguous (strides {buf.strides} for shape {buf.shape}); "
                      "pass a contiguous copy, e.g. numpy.ascontiguousarray")


def _backend(array, name: str, op: ReduceOp | None) -> type[Backend]:
    backend = backend_for(array)
    if backend is None:
        raise TypeError(f"{name} must be an array or a buffer, got {type(array).__name__}")
    if op is not None:
        check_dtype(array.dtype, op)
        backend.check(array, name, op)
    elif array.dtype.kind not in "biufcV" and array.dtype.kind != "?":
        raise TypeError(f"{name} has dtype {array.dtype}, which is not plain data")
    return backend


def _receiving(recvbuf, source, backend, op, needed: int, what: str):
    """recvbuf as the 1-D target of `needed` elements (its first, where it has more)."""
    target = _array(recvbuf, "recvbuf", writable=True)
    if backend_for(target) is not backend:
        raise TypeError(f"sendbuf is {type(source).__module__} memory but recvbuf is {type(target).__module__}'s")
    if target.dtype != source.dtype:
        raise TypeError(f"sendbuf has dtype {source.dtype} but recvbuf has dtype {target.dtype}")
    if target.size < needed:
        raise ValueError(f"recvbuf has {counted(target.size, 'element')}, too few for {what} ({needed})")
    if op is not None:
        backend.check(target, "recvbuf", op)
    target = target[:needed]
    if source.size and target.size and backend.aliasing(source, target) is not None:
        raise ValueError("sendbuf and recvbuf overlap; use MPI.IN_PLACE")
    return target


def _counts(counts, size: int, total: int | None, name: str) -> tuple[int, ...]:
    """Each rank's count: as given (a sequence of `size` counts >= 0, adding up to `total` where that
    is known), or, for None, `total` in equal blocks."""
    if counts is None:
        if total % size:
            raise ValueError(f"{name} has {counted(total, 'element')}, which do{'es' * (total == 1)} not split into "
                             f"{size} equal blocks; give counts")
        return (total // size,) * size
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__len__"):
        raise TypeError(f"counts must be a sequence of {size} counts, got {counts!r}")
    if len(counts) != size or not all(isinstance(c, numbers.Integral) and c >= 0 for c in counts):
        raise ValueError(f"counts must be {size} whole numbers >= 0, one per rank, got {list(counts)!r}")
    counts = tuple(int(c) for c in counts)
    if total is not None and sum(counts) != total:
        raise ValueError(f"counts add up to {sum(counts)} but {name} has {counted(total, 'element')}")
    return counts


def checked(name: str, comm, timeout, prepare):
    """(prepare(), the communicator's state, the settings, the timeout) of a call of collective `name`:
    its arguments checked by `prepare` (checked_call, or counts_of for an alltoall's counts), then the
    settings and the timeout; a refusal of any of them told to the other ranks."""
    with refusing(comm):
        arguments = prepare()
        if note_thread(comm):
            forget_waits_inside_mpi()
        try:
            current = settings.current()
        except settings.SettingError as error:
            comm_state(comm)  # a new communicator's set-up compares every rank's settings: none waits for this one
            raise settings.SettingError(f"ringtree {name} on rank {comm.Get_rank()}: {error}") from None
        timeout = checked_timeout(timeout, comm, current.timeout, name)
        state = comm_state(comm, timeout)
    state.check_usable()
    return arguments, state, current, timeout


def with_count_matrix(comm, algorithm, segment, check, timeout, buffers) -> tuple:
    """An alltoall's (sendbuf, recvbuf, sendcounts, recvcounts) as (sendbuf, recvbuf, the count matrix):
    the counts checked on this rank, then exchanged and compared (runtime/session/counts.py)."""
    sendbuf, recvbuf = buffers[:2]
    (sent, received), state, _, timeout = checked("alltoall", comm, timeout,
                                                  partial(counts_of, comm, algorithm, segment, check, *buffers))
    return sendbuf, recvbuf, count_matrix(state, sent, received, timeout)


def _named_counts(counts, size: int, name: str) -> tuple[int, ...]:
    if counts is None:
        raise ValueError(f"{name} is None: an alltoall given counts needs sendcounts and recvcounts "
                         "(recvcounts alone in place)")
    try:
        return _counts(counts, size, None, "")
    except (TypeError, ValueError) as error:
        raise type(error)(f"{name}: {error}") from None


def _root(root, size: int) -> int:
    if type(root) is int and 0 <= root < size:
        return root
    if isinstance(root, bool) or not isinstance(root, numbers.Integral) or not 0 <= root < size:
        raise ValueError(f"root {root!r} is not a rank of this communicator of {size}")
    return int(root)


def _shaped(buf) -> bool:
    """Whether a new result may take `buf`'s shape: an array or tensor, not a buffer specification."""
    return hasattr(buf, "shape") and not isinstance(buf, (list, tuple))


def _new(given, backend, shape, dtype):
    """A new result of the kind `given` is: a tensor for a tensor, else an array of the backend's."""
    if tensors.is_tensor(given):
        return given.new_empty(shape)
    return backend.empty(int(np.prod(shape)), dtype).reshape(shape)


def _flat_of(result):
    return _array(result, "recvbuf", writable=True)


def _context(given):
    if type(given) is np.ndarray:
        return None
    buf = given[0] if isinstance(given, (list, tuple)) else given
    return tensors.stream_of(buf) if tensors.is_tensor(buf) else None
