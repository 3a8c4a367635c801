"""`ringtree.torch`: DDP communication hooks on ringtree, kept at this name (they live in api/torch.py)."""

from .api.torch import HookState, allreduce_hook, bf16_compress_hook, fp16_compress_hook

__all__ = ["HookState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]
