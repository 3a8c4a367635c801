"""torch tensors as ringtree's arrays (for buffers.py): on the CPU through DLPack with no copy, on a
GPU as CuPy arrays, ordered on torch's current stream.

It never imports torch (ringtree.torch, the DDP hooks, is the one module that does): a tensor's
methods and the torch module that made it (sys.modules) serve.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext

import numpy as np

__all__ = ["as_array", "is_tensor", "new_like", "stream_of"]


def is_tensor(buf) -> bool:
    return type(buf).__module__.split(".")[0] == "torch"


def as_array(tensor, name: str):
    """A numpy (CPU) or CuPy (CUDA) array on the tensor's memory, of its shape and strides."""
    torch = sys.modules["torch"]  # loaded: it made the tensor
    tensor = tensor.detach()  # the same memory; DLPack refuses a tensor that requires grad
    if tensor.is_conj() or tensor.is_neg():
        raise ValueError(f"{name} is a tensor with a lazy conjugate or negation; call .resolve_conj() "
                         "or .resolve_neg() first")
    if tensor.device.type == "cpu":
        if tensor.dtype is torch.bfloat16:  # numpy has no bfloat16: ml_dtypes' type on the same bits
            return np.from_dlpack(tensor.view(torch.int16)).view(_bfloat16(name))
        return np.from_dlpack(tensor)
    if tensor.device.type == "cuda":
        if tensor.dtype is torch.bfloat16:
            raise TypeError(f"{name} is a bfloat16 CUDA tensor, which CuPy cannot hold; "
                            "reduce it in float32 or on the CPU")
        import cupy

        return cupy.from_dlpack(tensor)
    raise TypeError(f"{name} is a tensor on {tensor.device}; ringtree takes CPU and CUDA tensors")


def new_like(tensor):
    """A new tensor for the result of a call on `tensor`: same dtype, shape and device."""
    return tensor.new_empty(tensor.shape)


def stream_of(tensor):
    """What a call on `tensor` runs in: for a CUDA tensor, torch's current stream made CuPy's current
    one, so that ringtree's copies and kernels are ordered after the work that made the tensor."""
    if tensor.device.type != "cuda":
        return nullcontext()
    import cupy

    stream = sys.modules["torch"].cuda.current_stream(tensor.device)
    return cupy.cuda.ExternalStream(stream.cuda_stream, tensor.device.index)


def _bfloat16(name: str):
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(f"{name} is a bfloat16 tensor: ringtree reduces bfloat16 with ml_dtypes "
                        "(pip install ringtree[bf16])") from None
    return ml_dtypes.bfloat16
