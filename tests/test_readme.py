"""Every Python block of the README runs as written, under mpiexec on 2 and 3 ranks."""

import pathlib
import re

import pytest
from mpi4py import MPI

from conftest import run_mpiexec

README = pathlib.Path(__file__).parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)

pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("nranks", [2, 3])
@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.splitlines()[-1][:40])
def test_a_readme_block_runs_as_written(block, nranks, tmp_path):
    if "import torch" in block:
        pytest.importorskip("torch")  # scripts/test runs these in .venv-torch
    script = tmp_path / "block.py"
    script.write_text(block)
    run = run_mpiexec(nranks, str(script), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
