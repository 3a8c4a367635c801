"""Reads of another process's memory (Linux cross-memory attach, `process_vm_readv`): one copy,
by the kernel, from the sender's own pages into the receiver's, for the shared-memory transport's
large messages (shm.py). Another process of the same user may read a process's memory only where
the kernel allows it: ptrace rights (Yama's ptrace_scope, a container's seccomp profile), which
`allow_readers` asks for as Open MPI's shared-memory transport does."""

from __future__ import annotations

import ctypes
import os

import numpy as np

__all__ = ["allow_readers", "read"]

try:
    _libc = ctypes.CDLL(None, use_errno=True)
except (OSError, TypeError):  # no C library to load this way (Windows): no direct reads
    _libc = None
_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


_readv = getattr(_libc, "process_vm_readv", None) if _libc is not None else None
if _readv is not None:
    _readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    _readv.restype = ctypes.c_ssize_t


def allow_readers() -> None:
    """Let the other processes of this user read this one's memory where Yama would refuse siblings."""
    prctl = getattr(_libc, "prctl", None) if _libc is not None else None
    if prctl is not None:
        prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)  # refused without Yama: nothing to allow then


def read(pid: int, address: int, target: np.ndarray) -> None:
    """Copy `target.nbytes` bytes at `address` in process `pid` into `target` (contiguous); OSError
    where the kernel refuses."""
    if _readv is None:
        raise OSError("process_vm_readv is not available")
    done, total, base = 0, target.nbytes, target.ctypes.data
    local, remote = _Iovec(), _Iovec()
    while done < total:
        local.base, local.length = base + done, total - done
        remote.base, remote.length = address + done, total - done
        got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error) if error else "nothing read")
        done += got
