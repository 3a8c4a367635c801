"""The test command itself: a stage that runs out of time says, on each rank, which test it was running."""

import os
import pathlib
import subprocess
import sys

import pytest
from mpi4py import MPI

from conftest import MPIEXEC

SLEEPS = """
import time

def test_that_never_ends():
    time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
def test_a_stage_that_runs_out_of_time_names_the_test_each_rank_was_running(tmp_path):
    (tmp_path / "test_sleeps.py").write_text(SLEEPS)
    tests = pathlib.Path(__file__).parent
    command = ["timeout", "--kill-after=20", "8", str(MPIEXEC), "-n", "2", sys.executable, "-m", "mpi4py", "-m",
               "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
               str(tmp_path / "test_sleeps.py")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tests)})
    assert run.returncode == 124, run.stdout + run.stderr
    said = run.stdout + run.stderr
    for rank in range(2):
        assert f"[rank {rank} of 2] stopped (signal 15) in test_sleeps.py::test_that_never_ends" in said, said
    assert "in test_that_never_ends" in said, said  # the stack of the thread that was in it
