"""DDP communication hooks on ringtree: `ddp.register_comm_hook(state, ringtree.torch.allreduce_hook)`.

`state` is the communicator to reduce over: an mpi4py (or ringtree) communicator, None for
COMM_WORLD, or a `HookState`, which also counts the seconds spent in the hooks. The hooks mirror
torch's default ones (torch.distributed.algorithms.ddp_comm_hooks.default_hooks): each averages a
bucket (divided by the number of ranks first, as DDP's own, then summed) and returns a
torch.futures.Future of it, completed once ringtree's request is. A bucket's allreduce runs while
the backward pass goes on; the last bucket's hook waits for every one still in flight, so every
future is complete before DDP waits on it.

The one module of ringtree that imports torch. Its annotations are evaluated (no `from __future__
import annotations`): DDP checks a hook's return annotation.
"""

import time

import torch
from mpi4py import MPI

from ..runtime.session.state import comm_state
from .allreduce import iallreduce

__all__ = ["HookState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]


class HookState:
    """A hook's communicator and the seconds spent in its hooks (starting and waiting)."""

    def __init__(self, comm: MPI.Intracomm | None = None) -> None:
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.seconds = 0.0
        self.pending: list = []  # (request, future, what the future is given) of buckets in flight


def allreduce_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the ranks, as DDP's default allreduce does."""
    state = _state(state)
    started = time.perf_counter()
    tensor = bucket.buffer()
    tensor.div_(state.comm.Get_size())
    future = _start(state, tensor, lambda: tensor, bucket.is_last())
    state.seconds += time.perf_counter() - started
    return future


def fp16_compress_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket sent as float16 (divided before), decompressed into the bucket: torch's
    fp16_compress_hook on ringtree."""
    return _compressed(torch.float16, state, bucket)


def bf16_compress_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """The same in bfloat16 (ringtree reduces it with ml_dtypes: pip install ringtree[bf16])."""
    return _compressed(torch.bfloat16, state, bucket)


# DDP refuses a hook of this name without CUDA and NCCL (it means torch's own); ringtree's needs neither.
bf16_compress_hook.__name__ = bf16_compress_hook.__qualname__ = "ringtree_bf16_compress_hook"


def _compressed(dtype, state, bucket) -> torch.futures.Future[torch.Tensor]:
    state = _state(state)
    started = time.perf_counter()
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(state.comm.Get_size())

    def decompressed():
        buffer.copy_(compressed)
        return buffer

    future = _start(state, compressed, decompressed, bucket.is_last())
    state.seconds += time.perf_counter() - started
    return future


def _state(state) -> HookState:
    if isinstance(state, HookState):
        return state
    comm = MPI.COMM_WORLD if state is None else state
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"ringtree's DDP hooks take an mpi4py communicator, None or a ringtree.torch.HookState as "
                        f"their state, got {type(state).__name__}")
    session = comm_state(comm)  # set up as the first hook's allreduce would: every rank's hooks come in one order
    if session.hook is None:  # a communicator given as the state: its HookState, kept in its session
        session.hook = HookState(comm)
    return session.hook


def _start(state: HookState, tensor, result, last: bool) -> torch.futures.Future[torch.Tensor]:
    """Start the bucket's allreduce; complete the futures of the buckets done (all of them, for the
    last bucket: DDP waits on them next)."""
    future = torch.futures.Future()
    state.pending.append((iallreduce(MPI.IN_PLACE, tensor, MPI.SUM, comm=state.comm), future, result))
    still = []
    for request, waiting, value in state.pending:
        if last:
            request.wait()
        elif not request.test():
            still.append((request, waiting, value))
            continue
        waiting.set_result(value())
    state.pending = still
    return future
