"""ringtree as a torch.distributed process group: each collective torch calls runs on ringtree's
schedules (allreduce, broadcast, reduce, allgather, reduce-scatter, their coalesced forms, and
all_to_all_single of host tensors, its splits equal or given), with `auto` choosing among them and
MPI's own, or, where ringtree has none, on MPI's own nonblocking call over the group's communicator
(all_to_all of lists, all_to_all_single of CUDA tensors, gather, scatter, barrier, send and recv):
never on gloo.

A call torch waits for at once (`async_op=False`: its options' asyncOp) runs ringtree's blocking
collective, which is quicker for a small one; any other starts the nonblocking one and returns a Work
(torch_work.py) at once. What MPI moves as it is goes as bytes, so that every dtype travels, and a
CUDA tensor's through host memory. A tensor must be contiguous, as gloo requires; what the backend
does not do raises NotImplementedError naming the call.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from mpi4py import MPI

from ..runtime.in_flight import IN_FLIGHT
from ..schedule.ir import blocks
from .allreduce import allreduce, iallreduce
from .collectives import (
    allgather,
    alltoall,
    broadcast,
    iallgather,
    ialltoall,
    ibroadcast,
    ireduce,
    ireduce_scatter,
    reduce,
    reduce_scatter,
)
from .request import MPIOwn
from .torch_work import Work

__all__ = ["ProcessGroup"]

# ringtree's collectives: (blocking, nonblocking)
_CALLS = {"allreduce": (allreduce, iallreduce), "broadcast": (broadcast, ibroadcast), "reduce": (reduce, ireduce),
          "allgather": (allgather, iallgather), "reduce_scatter": (reduce_scatter, ireduce_scatter),
          "alltoall": (alltoall, ialltoall)}
_RedOp = dist.ReduceOp.RedOpType
_OPS = {_RedOp.SUM: MPI.SUM, _RedOp.AVG: "avg", _RedOp.PRODUCT: MPI.PROD, _RedOp.MIN: MPI.MIN, _RedOp.MAX: MPI.MAX,
        _RedOp.BAND: MPI.BAND, _RedOp.BOR: MPI.BOR, _RedOp.BXOR: MPI.BXOR}


class ProcessGroup(dist.ProcessGroup):
    """A torch process group over an MPI communicator whose ranks are the group's, in its order."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self._name = self._description = ""

    def getBackendName(self) -> str:  # noqa: N802 (torch's names, here and below)
        return "ringtree"

    # A group without a C++ backend keeps its name and description itself (torch sets them once made).
    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._description

    def setGroupDesc(self, description: str) -> None:  # noqa: N802
        self._description = description

    # Reductions and broadcasts: ringtree's schedules.

    def allreduce(self, tensors, opts=None) -> Work:
        op, factor = self._op("allreduce", opts, tensors)
        if factor is not None:
            for t in tensors:
                t.mul_(factor)
        return Work([_run(opts, "allreduce", MPI.IN_PLACE, _array(t), op, comm=self.comm) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors, opts=None) -> Work:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None) -> Work:
        root = 0 if opts is None else opts.rootRank
        self._contiguous("broadcast", tensors)
        return Work([_run(opts, "broadcast", _array(t), root, comm=self.comm) for t in tensors], tensors)

    def reduce(self, tensors, opts=None) -> Work:
        op, factor = self._op("reduce", opts, tensors)
        root = 0 if opts is None else opts.rootRank
        if self.comm.Get_rank() == root:
            for t in tensors if factor is not None else ():
                t.mul_(factor)
            requests = [_run(opts, "reduce", MPI.IN_PLACE, _array(t), op, root, comm=self.comm) for t in tensors]
        else:
            requests = [_run(opts, "reduce", _array(_scaled(t, factor)), None, op, root, comm=self.comm) for t in tensors]
        return Work(requests, tensors)

    def allgather(self, output_lists, inputs, opts=None) -> Work:
        self._contiguous("all_gather", inputs, *output_lists)
        requests, copies = [], []
        for outputs, tensor in zip(output_lists, inputs):
            counts = [t.numel() for t in outputs]
            packed = tensor.new_empty(sum(counts))
            requests.append(_run(opts, "allgather", _array(tensor), _array(packed), counts, comm=self.comm))
            copies.append((outputs, packed, counts))
        return Work(requests, output_lists, lambda: [_unpack(*copy) for copy in copies])

    def allgather_coalesced(self, output_lists, inputs, opts=None) -> Work:
        return self.allgather(output_lists, inputs, opts)

    def all_gather_single(self, output, tensor, opts=None) -> Work:
        return self.all_gather_single_coalesced([output], [tensor], opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> Work:
        self._contiguous("all_gather_into_tensor", outputs, inputs)
        self._multiple("all_gather_into_tensor", outputs, inputs)
        rank = self.comm.Get_rank()
        return Work([_run(opts, "allgather", _in_place_at(t, out, rank) or _array(_apart(t, out)),
                          _array(out), comm=self.comm) for out, t in zip(outputs, inputs)], outputs)

    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None) -> Work:
        op, factor = self._op("reduce_scatter", opts, outputs, *input_lists)
        requests = []
        for output, inputs in zip(outputs, input_lists):
            packed = torch.cat([t.reshape(-1) for t in inputs]) if inputs else output.new_empty(0)
            if factor is not None:
                packed.mul_(factor)
            counts = [t.numel() for t in inputs]
            requests.append(_run(opts, "reduce_scatter", _array(packed), _array(output), counts, op, comm=self.comm))
        return Work(requests, outputs)

    def reduce_scatter_single(self, output, tensor, opts=None) -> Work:
        return self.reduce_scatter_single_coalesced([output], [tensor], opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> Work:
        op, factor = self._op("reduce_scatter_tensor", opts, outputs, inputs)
        self._multiple("reduce_scatter_tensor", outputs, inputs, scattered=True)
        return Work([_run(opts, "reduce_scatter", _array(_apart(_scaled(t, factor), out)),
                          _array(out), None, op, comm=self.comm) for out, t in zip(outputs, inputs)], outputs)

    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # Alltoall, gather, scatter, send and recv: data moved as it is, as bytes on MPI's own calls but for
    # all_to_all_single of host tensors.

    def all_to_all_single(self, output, tensor, output_splits, input_splits, opts=None) -> Work:
        self._contiguous("all_to_all_single", [output, tensor])
        size = self.comm.Get_size()
        split = bool(output_splits or input_splits)
        send_counts = self._splits("all_to_all_single", tensor, input_splits, size, "input_split_sizes")
        receive_counts = self._splits("all_to_all_single", output, output_splits, size, "output_split_sizes")
        if not split and output.numel() != tensor.numel():
            raise ValueError(f"ringtree all_to_all_single on rank {self.comm.Get_rank()}: the output has "
                             f"{output.numel()} elements, the input {tensor.numel()}")
        source, target = _array(tensor), _array(output)
        if not (isinstance(source, torch.Tensor) or isinstance(target, torch.Tensor)):
            # ringtree's alltoall; given splits, its exchange of counts checks them against the other ranks'
            same = tensor.numel() and tensor.data_ptr() == output.data_ptr()
            counts = (send_counts, receive_counts) if split else ()
            return Work([_run(opts, "alltoall", MPI.IN_PLACE if same else source, target, *counts, comm=self.comm)],
                        [output])
        send, receive = _Bytes(tensor), _Bytes(output)
        return Work([self._mpi(opts, "Ialltoallv", send.message(send_counts), receive.message(receive_counts))],
                    [output], receive.back)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None) -> Work:
        self._contiguous("all_to_all", outputs, inputs)
        send, receive = _Bytes(_packed(inputs)), _Bytes(outputs[0].new_empty(sum(t.numel() for t in outputs)))
        send_counts, receive_counts = [t.numel() for t in inputs], [t.numel() for t in outputs]
        return Work([self._mpi(opts, "Ialltoallv", send.message(send_counts), receive.message(receive_counts))],
                    outputs, lambda: (receive.back(), _unpack(outputs, receive.tensor, receive_counts)))

    def gather(self, output_lists, inputs, opts=None) -> Work:
        root, rank = opts.rootRank, self.comm.Get_rank()
        self._contiguous("gather", inputs, *output_lists)
        send = _Bytes(inputs[0])
        if rank != root:
            return Work([self._mpi(opts, "Igatherv", send.message(), None, root)], output_lists)
        outputs = output_lists[0]
        counts = [t.numel() for t in outputs]
        receive = _Bytes(outputs[0].new_empty(sum(counts)))
        return Work([self._mpi(opts, "Igatherv", send.message(), receive.message(counts), root)],
                    output_lists, lambda: (receive.back(), _unpack(outputs, receive.tensor, counts)))

    def scatter(self, outputs, input_lists, opts=None) -> Work:
        root, rank = opts.rootRank, self.comm.Get_rank()
        self._contiguous("scatter", outputs, *input_lists)
        receive = _Bytes(outputs[0])
        if rank != root:
            return Work([self._mpi(opts, "Iscatterv", None, receive.message(), root)], outputs, receive.back)
        inputs = input_lists[0]
        send = _Bytes(_packed(inputs))
        counts = [t.numel() for t in inputs]
        return Work([self._mpi(opts, "Iscatterv", send.message(counts), receive.message(), root)],
                    outputs, receive.back)

    def send(self, tensors, dst, tag) -> Work:
        self._contiguous("send", tensors)
        data = _Bytes(tensors[0])
        return Work([self._mpi(None, "Isend", data.message(), dst, tag)], tensors)

    def recv(self, tensors, src, tag) -> Work:
        self._contiguous("recv", tensors)
        data = _Bytes(tensors[0])
        return Work([self._mpi(None, "Irecv", data.message(), src, tag)], tensors, data.back)

    def recv_anysource(self, tensors, tag) -> Work:
        raise NotImplementedError("ringtree's torch backend: recv from any source (dist.recv without src) "
                                  "is not supported; name the source rank")

    def barrier(self, opts=None) -> Work:
        return Work([self._mpi(opts, "Ibarrier")], None)

    # The checks every call makes before it starts anything.

    def _op(self, name: str, opts, *tensor_lists):
        """The MPI op (or "avg") of `opts`, and PREMUL_SUM's factor (SUM of the inputs times it), or None."""
        self._contiguous(name, *tensor_lists)
        reduce_op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        if reduce_op.op == _RedOp.PREMUL_SUM:
            return MPI.SUM, reduce_op.factor
        try:
            return _OPS[reduce_op.op], None
        except KeyError:
            raise NotImplementedError(f"ringtree's torch backend: {name} with {reduce_op.op} is not supported") from None

    def _contiguous(self, name: str, *tensor_lists) -> None:
        for tensors in tensor_lists:
            for tensor in tensors:
                if not tensor.is_contiguous():
                    raise ValueError(f"ringtree {name} on rank {self.comm.Get_rank()}: tensors must be contiguous "
                                     f"(got one of shape {tuple(tensor.shape)}, strides {tensor.stride()})")

    def _multiple(self, name: str, outputs, inputs, scattered: bool = False) -> None:
        size = self.comm.Get_size()
        for output, tensor in zip(outputs, inputs):
            small, large = (output, tensor) if scattered else (tensor, output)
            if large.numel() != size * small.numel():
                raise ValueError(f"ringtree {name} on rank {self.comm.Get_rank()}: the {'input' if scattered else 'output'} "
                                 f"has {large.numel()} elements, not {size} × {small.numel()}")

    def _splits(self, name: str, tensor, splits, size: int, what: str) -> list[int]:
        """Elements to or from each rank: `splits` are rows of dim 0; none means equal parts."""
        if not splits:
            if tensor.dim() == 0 or tensor.shape[0] % size:
                raise ValueError(f"ringtree {name} on rank {self.comm.Get_rank()}: dim 0 of a tensor of shape "
                                 f"{tuple(tensor.shape)} does not split into {size} equal parts; give {what}")
            return [tensor.numel() // size] * size
        if len(splits) != size or sum(splits) != (tensor.shape[0] if tensor.dim() else 1) or min(splits) < 0:
            raise ValueError(f"ringtree {name} on rank {self.comm.Get_rank()}: {what} {list(splits)} is not "
                             f"{size} counts summing to dim 0 of shape {tuple(tensor.shape)}")
        row = tensor.numel() // tensor.shape[0] if tensor.dim() and tensor.shape[0] else 0
        return [s * row for s in splits]

    def _mpi(self, opts, method: str, *arguments) -> MPIOwn | None:
        """MPI's nonblocking `method` of the communicator, started; or its blocking form, run (None),
        where torch waits at once and no collective of ringtree's engine is in flight: one would
        move only while this process polls, and a peer may wait for it before it enters this call."""
        if _waited_at_once(opts) and not IN_FLIGHT.running:
            getattr(self.comm, method[1].upper() + method[2:])(*arguments)
            return None
        return MPIOwn(self.comm, lambda: getattr(self.comm, method)(*arguments))


class _Bytes:
    """A contiguous tensor as bytes MPI moves: its own memory on the CPU, a host copy of a CUDA one
    (`back()` copies what was received into the tensor)."""

    def __init__(self, tensor) -> None:
        self.tensor = tensor
        self.host = tensor.detach().cpu() if tensor.device.type != "cpu" else tensor.detach()
        self.item = tensor.element_size()
        self.memory = self.host.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else bytearray()

    def message(self, counts=None):
        """[memory, MPI.BYTE], or with `counts` (elements per rank) [memory, (bytes, offsets), MPI.BYTE]."""
        if counts is None:
            return [self.memory, MPI.BYTE]
        placed = blocks(tuple(c * self.item for c in counts))
        return [self.memory, ([size for _, size in placed], [offset for offset, _ in placed]), MPI.BYTE]

    def back(self) -> None:
        if self.host.data_ptr() != self.tensor.data_ptr():  # a host copy
            self.tensor.copy_(self.host)


def _waited_at_once(opts) -> bool:
    """Whether torch waits for the call as soon as it returns (async_op=False)."""
    return opts is not None and not opts.asyncOp


def _run(opts, name: str, *arguments, **options):
    """ringtree's collective `name`: blocking where torch waits for it at once, returning None; else
    started, returning its request."""
    if _waited_at_once(opts):
        _CALLS[name][0](*arguments, **options)
        return None
    return _CALLS[name][1](*arguments, **options)


def _array(tensor):
    """A CPU tensor as a flat numpy array on its memory, the same array for the same tensor while it
    keeps its memory and shape (so that ringtree's calls repeated on it run bound to it, as on the
    same numpy arrays: again.AGAIN); ringtree's own conversion of any buffer, through DLPack, costs
    some 10 µs a call more. A CUDA tensor, or one of a dtype numpy lacks, as it is."""
    key = id(tensor)
    kept = _VIEWS.get(key)
    if kept is not None and kept[0]() is tensor and kept[1] == tensor.data_ptr() and kept[2].size == tensor.numel():
        return kept[2]
    if tensor.device.type != "cpu" or tensor.is_conj() or tensor.is_neg():
        return tensor
    try:
        if tensor.dtype is torch.bfloat16:
            import ml_dtypes

            array = tensor.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16).reshape(-1)
        else:
            array = tensor.detach().numpy().reshape(-1)
    except (TypeError, ImportError):  # ringtree's conversion says what is wrong
        return tensor
    if len(_VIEWS) >= _MAX_VIEWS:
        _VIEWS.clear()
    _VIEWS[key] = (weakref.ref(tensor, lambda ref: _VIEWS.get(key, (None,))[0] is ref and _VIEWS.pop(key)),
                   tensor.data_ptr(), array)
    return array


_VIEWS: dict = {}  # id(tensor) -> (a weak reference to it, its data_ptr, its array)
_MAX_VIEWS = 1024


def _in_place_at(tensor, output, rank: int):
    """MPI.IN_PLACE where `tensor` is block `rank` of `output` (FSDP gathers so), else None."""
    n = tensor.numel()
    if n and tensor.dtype == output.dtype and tensor.data_ptr() == output.data_ptr() + rank * n * tensor.element_size():
        return MPI.IN_PLACE
    return None


def _apart(tensor, output):
    """`tensor`, or a copy where its memory overlaps `output`'s (ringtree refuses inputs that overlap outputs)."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    out_start = output.data_ptr()
    overlaps = tensor.numel() and output.numel() and start < out_start + output.numel() * output.element_size() \
        and out_start < end
    return tensor.clone() if overlaps else tensor


def _scaled(tensor, factor):
    return tensor if factor is None else tensor * factor


def _packed(tensors):
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def _unpack(outputs, packed, counts) -> None:
    for output, part in zip(outputs, packed.split(counts)):
        output.copy_(part.view(output.shape))
