"""`from ringtree.allreduce import allreduce, iallreduce`: the public allreduce, kept at this name (it
lives in api/allreduce.py)."""

from .api.allreduce import Request, allreduce, iallreduce

__all__ = ["allreduce", "iallreduce", "Request"]
