"""Threads: concurrent calls on their own communicators, requests waited in other threads, and the
error when MPI does not let a second thread call."""

import os
import queue
import textwrap
import threading

import numpy as np
import pytest
from mpi4py import MPI

from conftest import assert_everywhere, run_mpiexec
from ringtree.allreduce import allreduce, iallreduce

# Sizes in int64 elements, 8 B to 4 MiB: the stepwise path, the engine unsplit and in segments, and MPI's own.
COUNTS = (1, 128, 8192, 1 << 17, 1 << 19)
THREADS = 4
CALLS = 250  # per thread: 1,000 in all


def hammer(comm):
    """4 threads, each with two communicators of its own, taken in turn, 250 calls each from 8 B to
    4 MiB, blocking, in place and nonblocking, every fourth request waited on by the next thread;
    against the sums of every rank's inputs, exact in integers."""
    rank = comm.Get_rank()
    comms = [comm.Dup() for _ in range(2 * THREADS)]  # made in one thread, in the same order on every rank
    handed = [queue.Queue() for _ in range(THREADS)]  # requests a thread started, for the next one to wait on
    failures = []

    def check(what, result, expected):
        if not np.array_equal(result, expected):
            failures.append(f"{what}: {np.count_nonzero(result != expected)} elements wrong")

    def inputs(k, call, of_rank):
        count = COUNTS[call % len(COUNTS)]
        return np.random.default_rng((of_rank, k, call)).integers(-1000, 1000, count).astype(np.int64)

    def work(k):
        try:
            for call in range(CALLS):
                own = comms[2 * k + call % 2]
                data = inputs(k, call, rank)
                # Every rank's inputs, made here: a blocking MPI call in this thread would not progress
                # the ringtree requests other threads leave to it (nor does it in one thread).
                expected = sum(inputs(k, call, r) for r in range(comm.Get_size()))
                how = call % 4
                if how == 0:
                    check(f"thread {k} call {call} blocking", allreduce(data, comm=own), expected)
                elif how == 1:
                    result = data.copy()
                    allreduce(MPI.IN_PLACE, result, comm=own, algorithm="ring", segment=1 << 14)
                    check(f"thread {k} call {call} in place", result, expected)
                elif how == 2:
                    check(f"thread {k} call {call} waited here", iallreduce(data, comm=own).wait(), expected)
                else:
                    handed[(k + 1) % THREADS].put((f"thread {k} call {call} waited by thread {(k + 1) % THREADS}",
                                                   iallreduce(data, comm=own), expected))
                while not handed[k].empty():
                    what, request, expected_there = handed[k].get()
                    check(what, request.wait(), expected_there)
        except Exception as error:  # a failure in a thread must reach the assertion
            failures.append(f"thread {k}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in range(THREADS):  # what was handed on after its receiver had finished
        while not handed[k].empty():
            what, request, expected = handed[k].get()
            check(what + " (after its receiver finished)", request.wait(), expected)
    for own in comms:
        own.Free()
    assert_everywhere(comm, failures)


HAMMER = """
    import sys
    from mpi4py import MPI
    sys.path.insert(0, sys.argv[1])
    from test_threads import hammer
    hammer(MPI.COMM_WORLD)
"""


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_threads_on_communicators_of_their_own_get_right_results_and_wait_on_each_others_requests(nranks):
    # A job of its own: once a second thread has called, no ringtree call in the process waits inside
    # MPI any more (runtime/threads.py), which the other tests should not run under.
    run = run_mpiexec(nranks, "-c", textwrap.dedent(HAMMER), os.path.dirname(__file__), timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr


SAME_COMMUNICATOR = """
    import threading, time
    import numpy as np
    from mpi4py import MPI
    import ringtree
    from ringtree.allreduce import allreduce
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    allreduce(np.ones(4), comm=comm)
    outcomes = []

    def work(k):
        data = np.full(100_000, float(rank + 1))
        try:
            for _ in range(40):
                allreduce(data, comm=comm)
            outcomes.append("no error")
        except ringtree.MismatchError as error:
            outcomes.append(str(error))

    started = time.perf_counter()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    said = any("two threads were in calls on it at once" in outcome for outcome in outcomes)
    print(f"rank {rank}: {'two threads named' if said else outcomes} after {time.perf_counter() - started:.1f} s")
"""


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("nranks", [2, 3])
def test_two_threads_in_calls_on_one_communicator_get_an_error_on_every_rank_not_a_hang(nranks):
    _every_rank_says(nranks, SAME_COMMUNICATOR, "two threads named after")


ONE_FAILS = """
    import threading
    import numpy as np
    from mpi4py import MPI
    import ringtree
    from ringtree.allreduce import allreduce, iallreduce
    from ringtree.runtime.mismatch import signature
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    failing, going_on = world.Dup(), world.Dup()
    for comm in (failing, going_on):
        allreduce(np.ones(3), comm=comm)
    # The last rank passes fewer elements, a count whose signature codes alike: the messages match and
    # are of another size, which a poll finds, in whichever thread polls.
    count = 300_000
    code = signature(count, np.dtype(np.float32), "sum", "ring", None).code
    fewer = next(c for c in range(count - 1, 0, -1) if signature(c, np.dtype(np.float32), "sum", "ring", None).code == code)
    outcomes = {}

    def fail():
        data = np.ones(fewer if rank == size - 1 else count, np.float32)
        try:
            for _ in range(3):
                iallreduce(data, comm=failing, algorithm="ring").wait()
            outcomes["failing"] = "no error"
        except ringtree.MismatchError:
            outcomes["failing"] = "MismatchError"
        except Exception as error:
            outcomes["failing"] = f"{type(error).__name__}: {error}"

    def go_on():
        wrong = 0
        try:
            for call in range(300):
                result = iallreduce(np.full(1000, rank + call, np.int64), comm=going_on, algorithm="ring").wait()
                wrong += int(result[0] != size * call + size * (size - 1) // 2)
            outcomes["going on"] = f"{wrong} wrong"
        except Exception as error:
            outcomes["going on"] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=fail), threading.Thread(target=go_on)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"rank {rank}: failing {outcomes['failing']}; going on {outcomes['going on']}", flush=True)
"""


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.skipif("Open MPI" in MPI.Get_library_version(),
                    reason="a message larger than its receive corrupts memory under Open MPI (docs/reliability.md)")
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_collective_that_fails_in_one_thread_raises_there_and_not_in_a_thread_that_polls_it(nranks):
    _every_rank_says(nranks, ONE_FAILS, "failing MismatchError; going on 0 wrong")


SERIALIZED = """
    import threading
    import mpi4py
    mpi4py.rc.thread_level = "serialized"
    import numpy as np
    from mpi4py import MPI
    from ringtree.allreduce import allreduce
    data = np.ones(4)
    allreduce(data)
    errors = []

    def second():
        try:
            allreduce(data)
        except RuntimeError as error:
            errors.append(str(error))

    thread = threading.Thread(target=second)
    thread.start()
    thread.join()
    print(errors[0] if errors else "no error")
    assert (allreduce(data) == MPI.COMM_WORLD.Get_size()).all()  # the first thread goes on
"""


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
def test_a_second_thread_under_a_thread_level_below_multiple_gets_a_clear_error():
    run = run_mpiexec(2, "-c", textwrap.dedent(SERIALIZED))
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in (0, 1):
        assert (f"ringtree allreduce on rank {rank}: a second thread calls ringtree, but MPI was initialised with "
                "MPI_THREAD_SERIALIZED") in run.stdout, run.stdout


def _every_rank_says(nranks, script, words) -> None:
    """Run `script` on `nranks` ranks; every rank's line of output reads "rank R: `words`"."""
    run = run_mpiexec(nranks, "-c", textwrap.dedent(script), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in range(nranks):
        assert f"rank {rank}: {words}" in run.stdout, run.stdout
