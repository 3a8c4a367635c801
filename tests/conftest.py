import numpy as np
import pytest
from mpi4py import MPI


def pytest_configure(config):
    # Under mpiexec every rank runs the suite; rank 0 reports in full, the others only failures.
    if MPI.COMM_WORLD.Get_rank() != 0:
        config.option.verbose = -2


@pytest.fixture
def comm():
    return MPI.COMM_WORLD


def assert_everywhere(comm, failures):
    """Collective assertion: fails on every rank if any rank has failures, naming them.

    Every rank must call it, so one rank's failure never leaves the others waiting.
    """
    failures = list(failures)
    everyone = comm.allgather(failures[:5])
    bad = {rank: f for rank, f in enumerate(everyone) if f}
    assert not bad, "failures by rank: " + "; ".join(f"rank {r}: {f}" for r, f in bad.items())


def same_on_all_ranks(comm, array):
    """True where every rank holds bitwise the same array."""
    return len(set(comm.allgather(np.ascontiguousarray(array).tobytes()))) == 1
