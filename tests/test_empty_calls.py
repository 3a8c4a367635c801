"""A call with no element. Where every rank makes it so, it ends, as MPI's own does, and the
communicator goes on; where only some ranks do, every rank raises MismatchError naming the counts
(a call that sends nothing would else end at once there and leave the others waiting), at a
communicator's first call and after one, for every collective, blocking and nonblocking, in check
mode too."""

import time

import numpy as np
import pytest

import ringtree
from conftest import assert_everywhere
from ringtree.runtime.safety.mismatch import ranks_text

pytestmark = pytest.mark.mpi


def _calls(size):
    """Each collective's call of `n` elements a rank (its block, where it has blocks) on `comm`, waited for."""
    return {
        "allreduce": lambda n, comm, **kw: ringtree.allreduce(np.ones(n), comm=comm, **kw),
        "iallreduce": lambda n, comm, **kw: ringtree.iallreduce(np.ones(n), comm=comm, **kw).wait(),
        "reduce_scatter": lambda n, comm, **kw: ringtree.reduce_scatter(np.ones(n * size), comm=comm, **kw),
        "allgather": lambda n, comm, **kw: ringtree.allgather(np.ones(n), comm=comm, **kw),
        "iallgather": lambda n, comm, **kw: ringtree.iallgather(np.ones(n), comm=comm, **kw).wait(),
        "broadcast": lambda n, comm, **kw: ringtree.broadcast(np.ones(n), root=0, comm=comm, **kw),
        "reduce": lambda n, comm, **kw: ringtree.reduce(np.ones(n), root=size - 1, comm=comm, **kw),
        "alltoall": lambda n, comm, **kw: ringtree.alltoall(np.ones(n * size), comm=comm, **kw),
    }


NAMES = list(_calls(1))


@pytest.mark.parametrize("name", NAMES)
def test_a_call_empty_on_every_rank_ends_and_the_communicator_goes_on(comm, name):
    mine = comm.Dup()
    call = _calls(comm.Get_size())[name]
    failures = []
    for _ in range(3):  # repeats: none is kept bound
        result = call(0, mine)
        if result is not None and np.size(result) != 0:
            failures.append(f"a result of {np.size(result)} elements")
    total = ringtree.allreduce(np.ones(3), comm=mine)
    if not np.array_equal(total, np.full(3, comm.Get_size())):
        failures.append(f"the next call gave {total}")
    assert_everywhere(comm, failures)
    mine.Free()


def test_empty_calls_started_together_end_in_any_order_between_others(comm):
    mine = comm.Dup()
    requests = [ringtree.iallreduce(np.ones(n), comm=mine) for n in (0, 5, 0, 0, 7, 0)]
    results = [requests[k].wait() for k in (5, 1, 3, 0, 4, 2)]
    sizes = [result.size for result in results]
    failures = [] if sizes == [0, 5, 0, 0, 7, 0] and all((r == comm.Get_size()).all() for r in results) else [sizes]
    assert_everywhere(comm, failures)
    mine.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [None, True], ids=["by default", "in check mode"])
@pytest.mark.parametrize("first", [True, False], ids=["first call", "after a call"])
@pytest.mark.parametrize("name", NAMES)
def test_a_call_empty_on_one_rank_only_raises_on_every_rank_naming_the_counts(comm, name, first, check):
    size, rank = comm.Get_size(), comm.Get_rank()
    odd = size - 1
    mine = comm.Dup()  # left unusable by the mismatch
    call = _calls(size)[name]
    if not first:
        ringtree.allreduce(np.ones(3), comm=mine)
    started = time.perf_counter()
    try:
        call(0 if rank == odd else 4, mine, check=check)
        failures = ["no MismatchError"]
    except ringtree.MismatchError as error:
        text, others = str(error), ranks_text(list(range(odd)))
        count = 4 * (size if name in ("reduce_scatter", "allgather", "iallgather", "alltoall") else 1)
        named = f"count: {count} on {others}; 0 on rank {odd}"
        failures = [] if named in text and "uint8" not in text else [f"{named!r} not in {text!r}"]
    if time.perf_counter() - started > 10:
        failures.append(f"took {time.perf_counter() - started:.1f} s")
    assert_everywhere(comm, failures)
    comm.Barrier()  # the next test starts together: the mismatch's reports take up to a few seconds
