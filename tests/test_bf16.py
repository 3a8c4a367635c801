"""bfloat16 (ml_dtypes) and float16 are reduced in their own type, each addition rounded, in the
order the schedule fixes: every rank's result is, bit for bit, what the same schedules compute when
replayed on the same values without MPI (sim.verify.replay)."""

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere
from ringtree.algorithms import ALGORITHMS
from ringtree.allreduce import allreduce
from ringtree.sim.verify import allreduce_schedules, replay

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_rounding_sum_is_the_schedules_own_sum_to_the_bit(comm, dtype, algorithm):
    size, count = comm.Get_size(), 1000
    everyone = [np.random.default_rng([11, r]).standard_normal(count).astype(dtype) for r in range(size)]
    got = allreduce(everyone[comm.Get_rank()], comm=comm, algorithm=algorithm)
    want = replay(allreduce_schedules(algorithm, size, count), everyone, np.add)[comm.Get_rank()]
    wider = np.sum([e.astype(np.float64) for e in everyone], axis=0).astype(dtype)  # accumulated wide
    failures = [] if got.tobytes() == want.tobytes() else [
        f"{np.count_nonzero(got.view(np.int16) != want.view(np.int16))} of {count} elements differ from the replay"]
    if size >= 3 and want.tobytes() == wider.tobytes():
        failures.append("the replay equals a wide sum: the inputs do not tell rounding apart")
    assert_everywhere(comm, failures)


def test_bfloat16_sums_in_place_and_averages(comm):
    data = np.full(100, comm.Get_rank() + 1, ml_dtypes.bfloat16)
    allreduce(MPI.IN_PLACE, data, comm=comm)
    size = comm.Get_size()
    mean = allreduce(np.full(100, 2.0, ml_dtypes.bfloat16), op="avg", comm=comm)
    ok = (data.astype(np.float64) == size * (size + 1) / 2).all() and (mean.astype(np.float64) == 2.0).all()
    assert_everywhere(comm, [] if ok else [f"got {data[:3]} and {mean[:3]}"])


@pytest.mark.parametrize("repeat", [1, 3], ids=["once", "repeated"])
def test_bfloat16_moves_through_every_collective_that_reduces_nothing(comm, repeat):
    """A broadcast or allgather of bfloat16 (which exports no buffer to MPI) goes as its bytes, through
    MPI's own persistent request too: the same bits as MPI's own call on its uint16 view."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = np.arange(4, dtype=np.float64).astype(ml_dtypes.bfloat16) + rank
    gathered, data = np.empty(4 * size, ml_dtypes.bfloat16), np.full(8, rank + 0.5, ml_dtypes.bfloat16)
    expected = np.empty(4 * size, np.uint16)
    comm.Allgather(mine.view(np.uint16), expected)
    failures = []
    for _ in range(repeat):
        ringtree.allgather(mine, gathered, comm=comm)
        ringtree.broadcast(data, root=size - 1, comm=comm)
    if gathered.view(np.uint16).tobytes() != expected.tobytes():
        failures.append(f"allgather gave {gathered}")
    if not (data.astype(np.float64) == size - 0.5).all():
        failures.append(f"broadcast gave {data}")
    assert_everywhere(comm, failures)
