"""The tensors of a call on ringtree's torch.distributed backend (torch_group.py) as its collectives
take them: flat numpy arrays on a tensor's memory, bytes for MPI's own calls, lists packed into one
tensor and unpacked, and contiguous stand-ins for outputs that are not contiguous (`Outputs`), whose
results are copied back once the call's work completes.
"""

from __future__ import annotations

import weakref

import torch
from mpi4py import MPI

from ..schedule.ir import blocks

__all__ = ["Bytes", "Outputs", "apart", "array", "in_place_at", "packed", "scaled", "shares_elements", "stand_ins",
           "unpack"]


class Outputs:
    """A call's outputs that are not contiguous, each with the contiguous tensor the call writes in
    its place; `then()` is what copies those into the caller's tensors, for the call's Work."""

    def __init__(self) -> None:
        self.copies: list = []  # (the caller's tensor, its stand-in)

    def of(self, tensor, keep: bool = False):
        """`tensor` where contiguous, else its stand-in: a copy of it with `keep` (the call reads it
        too, as an allreduce does), else new memory."""
        if tensor.is_contiguous():
            return tensor
        stand_in = tensor.contiguous() if keep else torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
        self.copies.append((tensor, stand_in))
        return stand_in

    def then(self, before=None):
        """`before` (what the work does once its requests are done), followed by the copies back."""
        if not self.copies:
            return before

        def finish() -> None:
            if before is not None:
                before()
            for tensor, stand_in in self.copies:
                tensor.copy_(stand_in)

        return finish


def stand_ins(tensors, factor=None):
    """For a call that reads and writes `tensors` in place: its Outputs, and the tensors it runs on
    (each tensor or its contiguous copy), times PREMUL_SUM's `factor` where there is one."""
    outputs = Outputs()
    buffers = [outputs.of(tensor, keep=True) for tensor in tensors]
    for buffer in buffers if factor is not None else ():
        buffer.mul_(factor)
    return outputs, buffers


def shares_elements(tensor) -> bool:
    """Whether elements of `tensor` share memory (an expanded tensor: a stride 0), so that a result
    has nowhere to go."""
    return any(stride == 0 and length > 1 for length, stride in zip(tensor.shape, tensor.stride()))


class Bytes:
    """A tensor as bytes MPI moves: its own memory where it is a contiguous host tensor, else a
    contiguous host copy (`back()` copies what was received into the tensor)."""

    def __init__(self, tensor) -> None:
        self.tensor = tensor
        self.host = tensor.detach().cpu().contiguous()
        self.item = tensor.element_size()
        self.memory = self.host.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else bytearray()

    def message(self, counts=None):
        """[memory, MPI.BYTE], or with `counts` (elements per rank) [memory, (bytes, offsets), MPI.BYTE]."""
        if counts is None:
            return [self.memory, MPI.BYTE]
        placed = blocks(tuple(c * self.item for c in counts))
        return [self.memory, ([size for _, size in placed], [offset for offset, _ in placed]), MPI.BYTE]

    def back(self) -> None:
        if self.host.data_ptr() != self.tensor.data_ptr():  # a copy
            self.tensor.copy_(self.host)


def array(tensor):
    """A contiguous CPU tensor as a flat numpy array on its memory, the same array for the same tensor
    while it keeps its memory and shape (so that ringtree's calls repeated on it run bound to it, as on
    the same numpy arrays: again.kept_runs); ringtree's own conversion of any buffer, through DLPack, costs
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

            flat = tensor.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16).reshape(-1)
        else:
            flat = tensor.detach().numpy().reshape(-1)
    except (TypeError, ImportError):  # ringtree's conversion says what is wrong
        return tensor
    if len(_VIEWS) >= _MAX_VIEWS:
        _VIEWS.clear()
    _VIEWS[key] = (weakref.ref(tensor, lambda ref: _VIEWS.get(key, (None,))[0] is ref and _VIEWS.pop(key)),
                   tensor.data_ptr(), flat)
    return flat


_VIEWS: dict = {}  # id(tensor) -> (a weak reference to it, its data_ptr, its array)
_MAX_VIEWS = 1024


def in_place_at(tensor, output, rank: int):
    """MPI.IN_PLACE where `tensor` is block `rank` of `output` (FSDP gathers so), else None."""
    n = tensor.numel()
    if n and tensor.dtype == output.dtype and tensor.data_ptr() == output.data_ptr() + rank * n * tensor.element_size():
        return MPI.IN_PLACE
    return None


def apart(tensor, output):
    """`tensor`, or a copy where its memory overlaps `output`'s (ringtree refuses inputs that overlap outputs)."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    out_start = output.data_ptr()
    overlaps = tensor.numel() and output.numel() and start < out_start + output.numel() * output.element_size() \
        and out_start < end
    return tensor.clone() if overlaps else tensor


def scaled(tensor, factor):
    return tensor if factor is None else tensor * factor


def packed(tensors):
    """The tensors' elements, one after another, in one contiguous tensor (whatever their strides)."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def unpack(outputs, whole, counts) -> None:
    """Copy `whole`'s consecutive parts of `counts` elements into `outputs` (whatever their strides)."""
    for output, part in zip(outputs, whole.split(counts)):
        output.copy_(part.view(output.shape))
