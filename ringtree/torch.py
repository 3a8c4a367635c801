"""`ringtree.torch`: importing it makes "ringtree" a torch.distributed backend
(`dist.init_process_group("ringtree")` under mpiexec: api/torch_backend.py); it also holds the DDP
communication hooks on ringtree (api/torch.py), for a gloo group."""

from .api.torch import HookState, allreduce_hook, bf16_compress_hook, fp16_compress_hook
from .api.torch_backend import NAME, register
from .api.torch_group import ProcessGroup

register()

__all__ = ["NAME", "ProcessGroup", "HookState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]
