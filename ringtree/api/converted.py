"""An allreduce of buffers that are not plain arrays (tensors, buffer specifications, DLPack, ...), turned
into arrays on the same memory (buffers.py); and every call that MPI's own collective computes for
ringtree (a user-defined op, MAXLOC, a derived datatype, displacements with gaps), as a ringtree call:
its arguments and settings checked, counted, with its signature (runtime/engine/passed_through.py)."""

from __future__ import annotations

from functools import partial

import numpy as np
from mpi4py import MPI

from .. import tensors
from ..algorithms import GENERATORS
from ..debug import configure_debug_logging, log
from ..ops import MPI_OP, ReduceOp, op_name, parse_op
from ..runtime.checks.refusal import refusing
from ..runtime.engine.native import NativeInFlight
from ..runtime.engine.passed_through import pass_through
from ..runtime.safety.mismatch import signature
from ..runtime.session.one_caller import in_call
from ..runtime.session.small import confirm_end
from ..runtime.transports.backend import NoDevice
from .buffers import converted, datatype_name, numpy_dtype, passes_through
from .checks import check_comm, check_options
from .collective_args import checked
from .request import Request

__all__ = ["converted_call", "passed_through"]

# The collective of each of mpi4py's methods passed to MPI's own (by Communicator; gather and scatter by the
# torch backend, which has them of ringtree's collectives alone), as its signature names it.
COLLECTIVES = {"Allreduce": "allreduce", "Reduce_scatter_block": "reduce_scatter", "Reduce_scatter": "reduce_scatter",
               "Allgather": "allgather", "Allgatherv": "allgather", "Bcast": "broadcast", "Reduce": "reduce",
               "Alltoall": "alltoall", "Alltoallv": "alltoall", "Gatherv": "gather", "Scatterv": "scatter"}
ROOT_LAST = ("Bcast", "Reduce", "Gatherv", "Scatterv")  # the methods whose last argument is the root


def converted_call(run, start, sendbuf, recvbuf, op, comm, algorithm="auto", timeout=None):
    """allreduce (`run`, of plain arrays) or iallreduce (`start`: one of them is None) of buffers that are
    not plain arrays, or that only MPI's own allreduce can reduce."""
    blocking = start is None
    comm = MPI.COMM_WORLD if comm is None else comm
    with refusing(comm):
        try:
            why = passes_through(op, sendbuf, recvbuf)
            call = converted(sendbuf, recvbuf) if why is None else None
            if why is not None:
                result, recvbuf = _received(sendbuf, recvbuf)
                mpi_op = _mpi_op(op)
        except (TypeError, ValueError, NoDevice) as error:
            raise type(error)(f"ringtree allreduce on rank {comm.Get_rank()}: {error}") from None
    if why is not None:
        send = MPI.IN_PLACE if sendbuf is None else sendbuf
        through = passed_through(comm, "Allreduce", algorithm, timeout, why, (send, recvbuf, op),
                                 lambda own: MPI.Intracomm.Iallreduce(own, send, recvbuf, mpi_op), blocking)
        return result if blocking else Request(through, result)
    with call.context:
        if blocking:
            result = run(call.send, call.recv, op, comm)
            return result if call.result is None else call.result
        request = start(call.send, call.recv, op, comm)
    if call.result is not None:
        request._result = call.result
    return request


def passed_through(comm, method: str, algorithm, timeout, why: str, arguments: tuple, start,
                   blocking: bool = False) -> NativeInFlight | None:
    """MPI's own collective of mpi4py's `method` with `arguments`, which ringtree does not compute
    (`why`), started by `start(comm)` on the communicator of its signature, once the call's
    communicator, options and settings are checked; under the thread rules, as every call (a refusal,
    also of what MPI finds wrong in the arguments at the start, told to the other ranks). `blocking`:
    waited for too, its end confirmed as a blocking call's (None returned)."""
    if not blocking:
        return in_call(comm, _passed_through, comm, method, algorithm, timeout, why, arguments, start)
    confirm = confirm_end if timeout is None else partial(confirm_end, timeout=timeout)
    return in_call(comm, _passed_through_and_waited, comm, method, algorithm, timeout, why, arguments, start,
                   confirm=confirm)


def _passed_through_and_waited(*arguments) -> None:
    _passed_through(*arguments).wait()


def _passed_through(comm, method: str, algorithm, timeout, why: str, arguments: tuple, start) -> NativeInFlight:
    name = COLLECTIVES[method]
    _, state, _, timeout = checked(name, comm, timeout, lambda: (
        check_comm(comm, name), name in GENERATORS and check_options(name, comm, algorithm, None, None)))
    configure_debug_logging(MPI.COMM_WORLD.Get_rank())
    log.info("%s passed through to MPI's own: ringtree does not compute %s", method, why)
    with refusing(comm):
        count, datatype, op, root = _described(method, arguments)
        sign = signature(count, datatype, op, algorithm, None, name, root)
        return pass_through(state, sign, timeout, start, arguments)


def _received(sendbuf, recvbuf) -> tuple:
    """(what the call returns, the receive buffer MPI takes) of a call MPI's own computes: for recvbuf
    None, a new array of sendbuf's kind, in a specification of sendbuf's datatype where it has one."""
    if recvbuf is not None:
        return recvbuf, recvbuf
    if sendbuf is None or sendbuf is MPI.IN_PLACE:
        raise ValueError("sendbuf is MPI.IN_PLACE, so recvbuf must hold the input, but it is None")
    given = sendbuf[0] if isinstance(sendbuf, (list, tuple)) else sendbuf
    if tensors.is_tensor(given):
        result = tensors.new_like(given)
    elif isinstance(given, np.ndarray):
        result = np.empty_like(given, subok=False)
    else:
        result = np.empty(memoryview(given).nbytes, np.uint8)
    return result, [result, *sendbuf[1:]] if isinstance(sendbuf, (list, tuple)) else result


def _mpi_op(op):
    """The MPI.Op that MPI's own allreduce takes for `op`: an MPI.Op as it is, a name as MPI's."""
    if isinstance(op, MPI.Op):
        return op
    reduce_op = parse_op(op)
    if reduce_op is ReduceOp.AVG:
        raise TypeError("op 'avg' is ringtree's: MPI's own allreduce, which computes this call, has none")
    return MPI_OP[reduce_op]


def _described(method: str, arguments: tuple) -> tuple:
    """(count, datatype, op, root) of a call MPI's own computes, as its signature says it: an allreduce's
    count and datatype are its buffer's; another collective's count is MPI's to check (-1)."""
    specs = [spec for spec in arguments if spec is not None and spec is not MPI.IN_PLACE
             and not isinstance(spec, (int, MPI.Op, str))]
    op = next((argument for argument in arguments if isinstance(argument, (MPI.Op, str))), None)
    if op is not None:
        known = _predefined(op)
        op = op_name(op) if known is None else known.value
    root = arguments[-1] if method in ROOT_LAST else None
    if method != "Allreduce":
        return -1, _message(specs[0])[1] if specs else "bytes", op, root
    count, datatype = _message(specs[-1])
    return count, datatype, op, root


def _predefined(op) -> ReduceOp | None:
    try:
        return parse_op(op)
    except ValueError:
        return None


def _message(spec) -> tuple:
    """(count, datatype) of a buffer specification, as MPI's own reads it (mpi4py's rules): the datatype as
    numpy's dtype where it is one, else its name."""
    buf, count, datatype = spec, None, None
    if isinstance(spec, (list, tuple)):
        buf, *rest = spec
        if rest and isinstance(rest[-1], (str, MPI.Datatype)):
            datatype = rest.pop()
        if rest:
            count = rest[0][0] if isinstance(rest[0], tuple) else rest[0]
            count = count if isinstance(count, (int, np.integer)) else None  # a vector's counts: MPI's to check
    if isinstance(datatype, str):
        datatype = MPI._typedict.get(datatype, MPI.BYTE)
    try:
        nbytes = memoryview(buf).nbytes
        if datatype is None:
            datatype = MPI._typedict.get(np.asarray(buf).dtype.char, MPI.BYTE)
    except (TypeError, ValueError):
        return (-1 if count is None else int(count)), datatype_name(datatype) if datatype is not None else "bytes"
    try:
        name = numpy_dtype(datatype)  # as ringtree's own calls name it
    except TypeError:
        name = datatype_name(datatype) + ("" if datatype.is_predefined else f" of {datatype.Get_size()} bytes")
    extent = max(datatype.Get_extent()[1], 1)
    return (nbytes // extent if count is None else int(count)), name
