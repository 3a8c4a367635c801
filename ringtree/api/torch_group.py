"""ringtree as a torch.distributed process group: each collective torch calls runs on ringtree's
schedules (allreduce, broadcast, reduce, allgather, reduce-scatter, their coalesced forms, and
all_to_all_single of host tensors, its splits equal or given), with `auto` choosing among them and
MPI's own, or, where ringtree has none, on MPI's own nonblocking call over the group's communicator
(all_to_all of lists, all_to_all_single of CUDA tensors, gather, scatter, barrier, send and recv):
never on gloo.

A call torch waits for at once (`async_op=False`: its options' asyncOp) runs ringtree's blocking
collective, which is quicker for a small one; any other starts the nonblocking one and returns a Work
(torch_work.py) at once. What MPI moves as it is goes as bytes, so that every dtype travels, and a
CUDA tensor's through host memory. Results are those gloo gives on contiguous tensors: bool tensors
reduce as gloo reduces them (SUM, MAX and BOR a logical or, PRODUCT, MIN and BAND an and, BXOR an
exclusive or), and a tensor need not be contiguous: an input is read through a contiguous copy, an
output written in a contiguous stand-in copied back when the work completes (torch_tensors.Outputs;
gloo 2.13 reads a strided view as if it were contiguous in all_reduce, broadcast, reduce,
reduce_scatter and scatter, and refuses one in all_to_all_single, send and recv). What the backend
does not do, sparse tensors among it, raises NotImplementedError naming the call, and bad arguments
(lists of the wrong length among them) a ValueError naming the call and the rank, before any message.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from ..runtime.safety.reliability import check_given_up
from ..runtime.session.state import comm_state
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
from .converted import passed_through
from .request import Request
from .torch_tensors import (
    Bytes,
    Outputs,
    apart,
    array,
    in_place_at,
    packed,
    scaled,
    shares_elements,
    stand_ins,
    unpack,
)
from .torch_work import PointToPoint, Work

__all__ = ["ProcessGroup"]

# ringtree's collectives: (blocking, nonblocking)
_CALLS = {"allreduce": (allreduce, iallreduce), "broadcast": (broadcast, ibroadcast), "reduce": (reduce, ireduce),
          "allgather": (allgather, iallgather), "reduce_scatter": (reduce_scatter, ireduce_scatter),
          "alltoall": (alltoall, ialltoall)}
_RedOp = dist.ReduceOp.RedOpType
# torch's op, by its value (pybind's enums hash slowly): the MPI op (or "avg"), and the one on bool tensors
# that gives gloo's result (measured, torch 2.13; MPI's arithmetic ops take no bool), or None where gloo has none.
_OPS = {op.value: ops for op, ops in {
    _RedOp.SUM: (MPI.SUM, MPI.LOR), _RedOp.AVG: ("avg", None), _RedOp.PRODUCT: (MPI.PROD, MPI.LAND),
    _RedOp.MIN: (MPI.MIN, MPI.LAND), _RedOp.MAX: (MPI.MAX, MPI.LOR), _RedOp.BAND: (MPI.BAND, MPI.LAND),
    _RedOp.BOR: (MPI.BOR, MPI.LOR), _RedOp.BXOR: (MPI.BXOR, MPI.LXOR), _RedOp.PREMUL_SUM: (MPI.SUM, None)}.items()}
_PREMUL_SUM = _RedOp.PREMUL_SUM.value
_SUM = dist.ReduceOp(dist.ReduceOp.SUM)  # where a call has no options
_NOTHING = np.empty(0, np.uint8)  # what a barrier allreduces
_WHY_MPI_COMPUTES = {"Igatherv": "a gather", "Iscatterv": "a scatter",  # why MPI's own computes each (its log line)
                     "Ialltoallv": "an alltoall of a list of tensors, or of CUDA tensors as bytes"}


class ProcessGroup(dist.ProcessGroup):
    """A torch process group over an MPI communicator whose ranks are the group's, in its order."""

    def __init__(self, comm: MPI.Intracomm, timeout: float | None = None) -> None:
        """`timeout`: the group's (torch's options), in seconds: every wait of a call on it keeps it, as the
        communicator's own (CommState.timeout), which leaves each call its quickest way. Collective: ringtree
        is set up on `comm` here."""
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm, self.timeout = comm, timeout
        self._state = comm_state(comm, timeout)
        self._state.timeout = timeout
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
        return self._allreduce("all_reduce", tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None) -> Work:
        return self._allreduce("all_reduce_coalesced", tensors, opts)

    def _allreduce(self, name: str, tensors, opts) -> Work:
        op_of, factor = self._op(name, opts, (), tensors)
        outputs, buffers = stand_ins(tensors, factor)
        return self._work([self._run(opts, "allreduce", MPI.IN_PLACE, array(b), op_of(b)) for b in buffers],
                    tensors, outputs.then())

    def broadcast(self, tensors, opts=None) -> Work:
        root = 0 if opts is None else opts.rootRank
        self._check("broadcast", (), tensors)
        outputs, buffers = stand_ins(tensors)
        return self._work([self._run(opts, "broadcast", array(b), root) for b in buffers], tensors, outputs.then())

    def reduce(self, tensors, opts=None) -> Work:
        root = 0 if opts is None else opts.rootRank
        at_root = self.comm.Get_rank() == root
        op_of, factor = self._op("reduce", opts, () if at_root else tensors, tensors if at_root else ())
        if not at_root:
            return self._work([self._run(opts, "reduce", array(scaled(t, factor).contiguous()), None, op_of(t), root)
                         for t in tensors], tensors)
        outputs, buffers = stand_ins(tensors, factor)
        return self._work([self._run(opts, "reduce", MPI.IN_PLACE, array(b), op_of(b), root) for b in buffers],
                    tensors, outputs.then())

    def allgather(self, output_lists, inputs, opts=None) -> Work:
        self._count("all_gather", "the list of outputs", output_lists, len(inputs), "input", "lists")
        for outputs in output_lists:
            self._count("all_gather", "an output list", outputs, self.comm.Get_size(), "rank")
        return self._allgather("all_gather", output_lists, inputs, opts, output_lists)

    def allgather_coalesced(self, output_lists, inputs, opts=None) -> Work:
        # torch's outputs are [rank][tensor] (its docstring; gloo's too), _allgather's [tensor][rank]
        self._count("all_gather_coalesced", "the list of outputs", output_lists, self.comm.Get_size(), "rank", "lists")
        for outputs in output_lists:
            self._count("all_gather_coalesced", "an output list", outputs, len(inputs), "input")
        return self._allgather("all_gather_coalesced", [list(by_rank) for by_rank in zip(*output_lists)], inputs,
                               opts, output_lists)

    def _allgather(self, name: str, output_lists, inputs, opts, result) -> Work:
        """Each input gathered into its list of outputs, one per rank, on ringtree's allgather."""
        rank = self.comm.Get_rank()
        self._check(name, inputs, [t for outputs in output_lists for t in outputs])
        for outputs, tensor in zip(output_lists, inputs):
            if outputs[rank].numel() != tensor.numel():
                raise ValueError(f"ringtree {name} on rank {rank}: its own output has {outputs[rank].numel()} "
                                 f"elements, its input {tensor.numel()}")
            if any(output.dtype != tensor.dtype for output in outputs):
                raise TypeError(f"ringtree {name} on rank {rank}: an output's dtype is not its input's, {tensor.dtype}")
        requests, copies = [], []
        for outputs, tensor in zip(output_lists, inputs):
            counts = [t.numel() for t in outputs]
            whole = tensor.new_empty(sum(counts))
            requests.append(self._run(opts, "allgather", array(tensor.contiguous()), array(whole), counts))
            copies.append((outputs, whole, counts))
        return self._work(requests, result, lambda: [unpack(*copy) for copy in copies])

    def all_gather_single(self, output, tensor, opts=None) -> Work:
        return self.all_gather_single_coalesced([output], [tensor], opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> Work:
        name, rank = "all_gather_into_tensor", self.comm.Get_rank()
        self._count(name, "the list of outputs", outputs, len(inputs), "input")
        self._check(name, inputs, outputs)
        self._multiple(name, outputs, inputs)
        targets, requests = Outputs(), []
        for output, tensor in zip(outputs, inputs):
            target, tensor = targets.of(output), tensor.contiguous()
            requests.append(self._run(opts, "allgather", in_place_at(tensor, target, rank) or array(apart(tensor, target)),
                                 array(target)))
        return self._work(requests, outputs, targets.then())

    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None) -> Work:
        self._count("reduce_scatter", "the list of inputs", input_lists, len(outputs), "output", "lists")
        for inputs in input_lists:
            self._count("reduce_scatter", "an input list", inputs, self.comm.Get_size(), "rank")
        op_of, factor = self._op("reduce_scatter", opts, [t for inputs in input_lists for t in inputs], outputs)
        targets, requests = Outputs(), []
        for output, inputs in zip(outputs, input_lists):
            whole = packed(inputs)
            if factor is not None:
                whole.mul_(factor)
            requests.append(self._run(opts, "reduce_scatter", array(whole), array(targets.of(output)),
                                 [t.numel() for t in inputs], op_of(output)))
        return self._work(requests, outputs, targets.then())

    def reduce_scatter_single(self, output, tensor, opts=None) -> Work:
        return self.reduce_scatter_single_coalesced([output], [tensor], opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> Work:
        name = "reduce_scatter_tensor"
        self._count(name, "the list of outputs", outputs, len(inputs), "input")
        op_of, factor = self._op(name, opts, inputs, outputs)
        self._multiple(name, outputs, inputs, scattered=True)
        targets, requests = Outputs(), []
        for output, tensor in zip(outputs, inputs):
            target = targets.of(output)
            requests.append(self._run(opts, "reduce_scatter", array(apart(scaled(tensor, factor).contiguous(), target)),
                                 array(target), None, op_of(tensor)))
        return self._work(requests, outputs, targets.then())

    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # Alltoall, gather, scatter, send and recv: data moved as it is, as bytes on MPI's own calls but for
    # all_to_all_single of host tensors.

    def all_to_all_single(self, output, tensor, output_splits, input_splits, opts=None) -> Work:
        name, size = "all_to_all_single", self.comm.Get_size()
        self._check(name, [tensor], [output])
        split = bool(output_splits or input_splits)
        send_counts = self._splits(name, tensor, input_splits, size, "input_split_sizes")
        receive_counts = self._splits(name, output, output_splits, size, "output_split_sizes")
        if not split and output.numel() != tensor.numel():
            raise ValueError(f"ringtree {name} on rank {self.comm.Get_rank()}: the output has "
                             f"{output.numel()} elements, the input {tensor.numel()}")
        targets = Outputs()
        contiguous, target = tensor.contiguous(), targets.of(output)
        source, target_array = array(contiguous), array(target)
        if not (isinstance(source, torch.Tensor) or isinstance(target_array, torch.Tensor)):
            # ringtree's alltoall; given splits, its exchange of counts checks them against the other ranks'
            same = contiguous.numel() and contiguous.data_ptr() == target.data_ptr()
            counts = (send_counts, receive_counts) if split else ()
            return self._work([self._run(opts, "alltoall", MPI.IN_PLACE if same else source, target_array, *counts)],
                        [output], targets.then())
        send, receive = Bytes(tensor), Bytes(output)
        return self._work([self._mpi(opts, "Ialltoallv", send.message(send_counts), receive.message(receive_counts))],
                    [output], receive.back)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None) -> Work:
        self._count("all_to_all", "the list of outputs", outputs, self.comm.Get_size(), "rank")
        self._count("all_to_all", "the list of inputs", inputs, self.comm.Get_size(), "rank")
        self._check("all_to_all", inputs, outputs)
        send, receive = Bytes(packed(inputs)), Bytes(outputs[0].new_empty(sum(t.numel() for t in outputs)))
        send_counts, receive_counts = [t.numel() for t in inputs], [t.numel() for t in outputs]
        return self._work([self._mpi(opts, "Ialltoallv", send.message(send_counts), receive.message(receive_counts))],
                    outputs, lambda: (receive.back(), unpack(outputs, receive.tensor, receive_counts)))

    def gather(self, output_lists, inputs, opts=None) -> Work:
        root, rank = opts.rootRank, self.comm.Get_rank()
        self._check("gather", inputs, [t for outputs in output_lists for t in outputs])
        send = Bytes(inputs[0])
        if rank != root:
            return self._work([self._mpi(opts, "Igatherv", send.message(), None, root)], output_lists)
        outputs = output_lists[0]
        self._count("gather", "the output list", outputs, self.comm.Get_size(), "rank")
        counts = [t.numel() for t in outputs]
        receive = Bytes(outputs[0].new_empty(sum(counts)))
        return self._work([self._mpi(opts, "Igatherv", send.message(), receive.message(counts), root)],
                    output_lists, lambda: (receive.back(), unpack(outputs, receive.tensor, counts)))

    def scatter(self, outputs, input_lists, opts=None) -> Work:
        root, rank = opts.rootRank, self.comm.Get_rank()
        self._check("scatter", [t for inputs in input_lists for t in inputs], outputs)
        receive = Bytes(outputs[0])
        if rank != root:
            return self._work([self._mpi(opts, "Iscatterv", None, receive.message(), root)], outputs, receive.back)
        inputs = input_lists[0]
        self._count("scatter", "the input list", inputs, self.comm.Get_size(), "rank")
        send = Bytes(packed(inputs))
        counts = [t.numel() for t in inputs]
        return self._work([self._mpi(opts, "Iscatterv", send.message(counts), receive.message(), root)],
                    outputs, receive.back)

    def send(self, tensors, dst, tag) -> Work:
        self._check("send", tensors, ())
        data = Bytes(tensors[0])
        return self._work([self._mpi(None, "Isend", data.message(), dst, tag)], tensors)

    def recv(self, tensors, src, tag) -> Work:
        self._check("recv", (), tensors)
        data = Bytes(tensors[0])
        return self._work([self._mpi(None, "Irecv", data.message(), src, tag)], tensors, data.back)

    def recv_anysource(self, tensors, tag) -> Work:
        raise NotImplementedError("ringtree's torch backend: recv from any source (dist.recv without src) "
                                  "is not supported; name the source rank")

    def barrier(self, opts=None) -> Work:
        # An allreduce of nothing: every rank tells every other it is there, and waits for their word
        # (runtime/engine/empty.py), under the group's timeout, which MPI's own barrier would not keep.
        return self._work([self._run(opts, "allreduce", _NOTHING)], None)

    # The checks every call makes before it starts anything.

    def _op(self, name: str, opts, inputs, outputs):
        """The MPI op of `opts` for a tensor (a function of it: bool tensors take the logical op that
        gives gloo's result), and PREMUL_SUM's factor (SUM of the inputs times it), or None."""
        self._check(name, inputs, outputs)
        reduce_op = _SUM if opts is None else opts.reduceOp
        kind = reduce_op.op.value
        if kind not in _OPS:
            raise NotImplementedError(f"ringtree's torch backend: {name} with {reduce_op.op} is not supported")
        op, on_bool = _OPS[kind]
        factor = reduce_op.factor if kind == _PREMUL_SUM else None
        if on_bool is None and any(t.dtype is torch.bool for t in (*inputs, *outputs)):
            raise TypeError(f"ringtree {name} on rank {self.comm.Get_rank()}: {reduce_op.op} of bool tensors is "
                            "not defined (gloo refuses it too)")
        return (lambda tensor: on_bool if tensor.dtype is torch.bool else op), factor

    def _check(self, name: str, inputs, outputs) -> None:
        """Refuse what the backend cannot take: sparse tensors, and outputs whose elements share memory."""
        for tensor in (*inputs, *outputs):
            if tensor.layout != torch.strided:
                raise NotImplementedError(f"ringtree's torch backend: {name} of a sparse tensor (layout "
                                          f"{tensor.layout}) is not supported; pass its dense form (to_dense())")
        for tensor in outputs:
            if not tensor.is_contiguous() and shares_elements(tensor):
                raise ValueError(f"ringtree {name} on rank {self.comm.Get_rank()}: an output of shape "
                                 f"{tuple(tensor.shape)}, strides {tensor.stride()}, has elements that share memory")

    def _count(self, name: str, what: str, items, expected: int, each: str, noun: str = "tensors") -> None:
        if len(items) != expected:
            raise ValueError(f"ringtree {name} on rank {self.comm.Get_rank()}: {what} holds {len(items)} {noun}, "
                             f"not one per {each} ({expected})")

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

    def _mpi(self, opts, method: str, *arguments) -> Request | PointToPoint | None:
        """MPI's own nonblocking `method` of the group, started; waited for where torch waits at once (None).
        A collective is a ringtree call that MPI computes (api/converted.py: counted, with its signature
        and the group's timeout); a send or receive, MPI's own on the group's communicator."""
        if method in ("Isend", "Irecv"):
            what = f"{method[1:].lower()} with rank {arguments[1]}, tag {arguments[2]}"
            request = PointToPoint(self.comm, lambda: getattr(self.comm, method)(*arguments), self.timeout, what,
                             method == "Irecv", arguments, self._state.abandoned)
        else:
            start = getattr(MPI.Intracomm, method)
            request = Request(passed_through(self.comm, method[1].upper() + method[2:], "auto", None,
                                             _WHY_MPI_COMPUTES[method], arguments,
                                             lambda own: start(own, *arguments)), None)
        if _waited_at_once(opts):
            request.wait()
            return None
        return request

    def _run(self, opts, name: str, *arguments):
        """ringtree's collective `name` on the group: blocking where torch waits for it at once, returning
        None; else started, returning its request."""
        if _waited_at_once(opts):
            _CALLS[name][0](*arguments, comm=self.comm)
            return None
        return _CALLS[name][1](*arguments, comm=self.comm)

    def _work(self, requests, result, then=None) -> Work:
        """The work of a call just started: once its requests are done, it raises where another rank gave
        up the call, or an earlier one, after the timeout (reliability.give_up), though this rank's
        messages may all have come."""
        return Work(requests, result, then, partial(check_given_up, self._state, self._state.calls - 1, "call"))


def _waited_at_once(opts) -> bool:
    """Whether torch waits for the call as soon as it returns (async_op=False)."""
    return opts is not None and not opts.asyncOp


