"""Finding out whether the MPI library is CUDA-aware, asked of the library this process really loaded."""

import os
import subprocess
import sys

import pytest
from mpi4py import MPI

from ringtree.runtime.transports.cuda import detect, loaded_mpi_library

pytestmark = pytest.mark.mpi  # so that it runs under each MPI the suite covers


def test_the_loaded_mpi_library_is_found_and_asked():
    library = loaded_mpi_library()
    assert library is not None and os.path.basename(library).startswith("libmpi.so")
    support = detect(None, library)
    query = "MPIX_GPU_query_support(CUDA)" if MPI.get_vendor()[0] == "MPICH" else "MPIX_Query_cuda_support()"
    assert support.reason in (f"{os.path.basename(library)}: {query} = {answer}" for answer in (0, 1))
    assert support.aware == support.reason.endswith("= 1")
    if library.startswith(sys.prefix):  # the PyPI wheels, which are not CUDA-aware
        assert not support.aware


def test_the_setting_wins_over_the_library():
    library = loaded_mpi_library()
    assert detect(True, library) == (True, "RINGTREE_CUDA_AWARE=1")
    assert detect(False, library) == (False, "RINGTREE_CUDA_AWARE=0")


def test_a_library_that_cannot_tell_is_taken_as_not_cuda_aware():
    assert detect(None, None) == (False, "no MPI library found among this process's mappings")
    support = detect(None, "libc.so.6")
    assert not support.aware and "has neither MPIX_GPU_query_support nor MPIX_Query_cuda_support" in support.reason


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="runs a process of its own")
def test_the_answer_is_logged_once_with_ringtree_debug():
    code = "from ringtree.runtime.transports.cuda import cuda_support; cuda_support(); print(cuda_support().aware)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RINGTREE_DEBUG": "1", "RINGTREE_CUDA_AWARE": "1"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"
    assert run.stderr.count("ringtree: MPI is CUDA-aware: RINGTREE_CUDA_AWARE=1") == 1
