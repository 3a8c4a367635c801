"""Calls that MPI's own collective computes for ringtree (a user-defined op, MAXLOC and MINLOC on pair
datatypes, a derived datatype) keep the promises every other call keeps: MPI's result, a new result
array for recvbuf None, MismatchError on every rank where the ranks differ (also from a rank that makes
the call on ringtree's own), a timeout that raises on every rank, and the stall warning."""

import pathlib
import textwrap
import time

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere, run_mpiexec
from ringtree.runtime.session.state import comm_state

one_rank_only = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
PAIR = np.dtype([("value", "f8"), ("rank", "i4")], align=True)  # MPI.DOUBLE_INT's layout


def _pairs(rank, count=3):
    pairs = np.zeros(count, PAIR)
    pairs["value"], pairs["rank"] = (np.arange(count) * (rank + 1)) % 4, rank
    return pairs


def _bigger():
    """A user-defined op: the larger of two float64s."""
    return MPI.Op.Create(lambda a, b, t: np.maximum(np.frombuffer(a, np.float64), np.frombuffer(b, np.float64),
                                                    out=np.frombuffer(b, np.float64)), commute=True)


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["MAXLOC", "MINLOC"])
def test_maxloc_without_recvbuf_gives_a_new_array_of_mpis_result(comm, op):
    mine = _pairs(comm.Get_rank())
    native = np.empty_like(mine)
    comm.Allreduce([mine, MPI.DOUBLE_INT], [native, MPI.DOUBLE_INT], getattr(MPI, op))
    ours = ringtree.allreduce([mine, MPI.DOUBLE_INT], op=getattr(MPI, op), comm=comm)
    started = ringtree.iallreduce([mine, MPI.DOUBLE_INT], op=getattr(MPI, op), comm=comm).wait()
    failures = []
    for label, result in (("blocking", ours), ("nonblocking", started)):
        if type(result) is not np.ndarray or result.dtype != PAIR or result.shape != mine.shape:
            failures.append(f"{label}: a {type(result).__name__} {getattr(result, 'dtype', '')}")
        elif not (np.array_equal(result["value"], native["value"]) and np.array_equal(result["rank"], native["rank"])):
            failures.append(f"{label}: {result}, MPI gives {native}")
    assert_everywhere(comm, failures)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("what", ["a user-defined op on one rank", "MAXLOC on one rank", "counts"])
def test_ranks_that_differ_on_a_call_mpi_computes_all_raise_mismatch_error_naming_it(comm, what):
    rank, odd = comm.Get_rank(), comm.Get_size() - 1
    mine = comm.Dup()  # left unusable
    ringtree.allreduce(np.ones(3), comm=mine)
    bigger = _bigger()
    started = time.perf_counter()
    try:
        if what == "a user-defined op on one rank":
            ringtree.allreduce(np.ones(4), op=bigger if rank == odd else MPI.SUM, comm=mine)
        elif what == "MAXLOC on one rank":
            op = MPI.MAXLOC if rank == odd else MPI.MINLOC
            ringtree.allreduce([_pairs(rank), MPI.DOUBLE_INT], op=op, comm=mine)
        else:
            ringtree.allreduce([_pairs(rank, 3 + (rank == odd)), MPI.DOUBLE_INT], op=MPI.MAXLOC, comm=mine)
        failures = ["no MismatchError"]
    except ringtree.MismatchError as error:
        named = {"a user-defined op on one rank": f"op: 'sum' on {_others(odd)}; 'a user-defined MPI.Op' on rank {odd}",
                 "MAXLOC on one rank": f"op: 'MPI.MINLOC' on {_others(odd)}; 'MPI.MAXLOC' on rank {odd}",
                 "counts": f"count: 3 on {_others(odd)}; 4 on rank {odd}"}[what]
        failures = [] if named in str(error) else [f"{named!r} not in {error}"]
    finally:
        bigger.Free()
    if time.perf_counter() - started > 10:
        failures.append(f"took {time.perf_counter() - started:.1f} s")
    assert_everywhere(comm, failures)
    comm.Barrier()


def _others(odd):
    return "rank 0" if odd == 1 else f"ranks 0-{odd - 1}"


@pytest.mark.mpi
def test_a_communicators_calls_mpi_computes_give_mpis_results_and_are_ringtree_calls(comm):
    rt = ringtree.Communicator(comm.Dup())
    bigger = _bigger()
    rank, size = comm.Get_rank(), comm.Get_size()
    data = np.arange(6, dtype=np.float64) * (rank + 1)
    failures = []
    try:
        for root in range(size):
            ours, native = np.zeros(6), np.zeros(6)
            rt.Reduce(data, ours, bigger, root)
            comm.Reduce(data, native, bigger, root)
            if rank == root and not np.array_equal(ours, native):
                failures.append(f"Reduce to {root}: {ours}, MPI gives {native}")
        ours, native = np.zeros(6 // size * size), np.zeros(6 // size * size)
        request = rt.Ireduce_scatter_block(data[:6 // size * size], ours[:6 // size], bigger)
        request.Wait()
        comm.Reduce_scatter_block(data[:6 // size * size], native[:6 // size], bigger)
        if not np.array_equal(ours, native):
            failures.append(f"Ireduce_scatter_block: {ours}, MPI gives {native}")
        # Counted as the same calls of an op ringtree computes are (the first blocking one confirmed too).
        computed = ringtree.Communicator(comm.Dup())
        for root in range(size):
            computed.Reduce(data, np.zeros(6), MPI.MAX, root)
        computed.Ireduce_scatter_block(data[:6 // size * size], np.zeros(6 // size), MPI.MAX).Wait()
        calls, expected = comm_state(rt).calls, comm_state(computed).calls
        if calls != expected:
            failures.append(f"{calls} calls counted, {expected} of an op ringtree computes")
        computed.Free()
    finally:
        bigger.Free()
    assert_everywhere(comm, failures)
    rt.Free()


LATE = """
    import pathlib, sys, time
    import numpy as np
    from mpi4py import MPI
    import ringtree
    world, folder = MPI.COMM_WORLD, pathlib.Path(sys.argv[1])
    rank, late = world.Get_rank(), world.Get_size() - 1
    pairs = np.zeros(2, np.dtype([("value", "f8"), ("rank", "i4")], align=True))
    out = np.empty_like(pairs)
    ringtree.allreduce([pairs, MPI.DOUBLE_INT], [out, MPI.DOUBLE_INT], op=MPI.MAXLOC)  # sets up, and its plan
    if rank == late:
        time.sleep(3.5)
    started = time.perf_counter()
    try:
        ringtree.allreduce([pairs, MPI.DOUBLE_INT], [out, MPI.DOUBLE_INT], op=MPI.MAXLOC, timeout=1.5)
        outcome = "returned"
    except ringtree.TimeoutError as error:
        outcome = f"TimeoutError: {error}"
    (folder / f"rank-{rank}.txt").write_text(f"{time.perf_counter() - started:.2f} s: {outcome}")
"""


@pytest.mark.slow
@one_rank_only
def test_a_timeout_holds_for_a_call_mpi_computes_and_the_late_rank_raises_too(tmp_path):
    run = run_mpiexec(2, "-c", textwrap.dedent(LATE), str(tmp_path), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    waited, late = (pathlib.Path(tmp_path, f"rank-{rank}.txt").read_text() for rank in (0, 1))
    seconds, outcome = waited.split(" s: ", 1)
    assert 1.5 <= float(seconds) < 3, waited
    assert "MPI.MAXLOC" in outcome and "made no progress for 1.5 s; it waits in MPI's own allreduce" in outcome, waited
    assert "not in any ringtree collective on this communicator: rank 1" in outcome, waited
    seconds, outcome = late.split(" s: ", 1)
    assert float(seconds) < 1 and "rank 0 gave this call up after its timeout" in outcome, late
