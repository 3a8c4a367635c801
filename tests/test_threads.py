"""Threads: concurrent calls on their own communicators, requests waited in other threads, and the
error when MPI does not let a second thread call."""

import os
import queue
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from conftest import assert_everywhere, run_mpiexec
from ringtree import alltoall, ialltoall
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
            # and the output at once: the other ranks may then wait for this thread's calls for ever
            print(f"rank {rank} {failures[-1]}", file=sys.stderr, flush=True)

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
    import faulthandler, sys
    from mpi4py import MPI
    faulthandler.dump_traceback_later(200)  # a hang shows where each thread of each rank waits
    sys.path.insert(0, sys.argv[1])
    from test_threads import hammer
    hammer(MPI.COMM_WORLD)
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_threads_on_communicators_of_their_own_get_right_results_and_wait_on_each_others_requests(nranks):
    # A job of its own: once a second thread has called, no ringtree call in the process waits inside
    # MPI any more (runtime/safety/threads.py), which the other tests should not run under.
    run = run_mpiexec(nranks, "-c", textwrap.dedent(HAMMER), os.path.dirname(__file__), timeout=260)
    assert run.returncode == 0, run.stdout + run.stderr


def alltoalls_given_counts(comm):
    """Two threads, each on a communicator of its own, blocking and started alltoalls given counts that
    change from call to call: every result is the blocks the other ranks made for this one."""
    size, rank = comm.Get_size(), comm.Get_rank()
    comms = [comm.Dup() for _ in range(2)]
    failures = []

    def block(source, target, thread, call):  # what rank source sends rank target
        return np.arange((source + target + thread + call) % 4, dtype=np.int64) + 100 * source + 10 * call

    def work(thread):
        try:
            for call in range(40):
                blocks = [block(rank, d, thread, call) for d in range(size)]
                expected = np.concatenate([block(s, rank, thread, call) for s in range(size)])
                sent, received = [b.size for b in blocks], [block(s, rank, thread, call).size for s in range(size)]
                options = {"comm": comms[thread], "algorithm": "pairwise" if call % 3 else "auto"}
                if call % 2:
                    got = ialltoall(np.concatenate(blocks), None, sent, received, **options).wait()
                else:
                    got = alltoall(np.concatenate(blocks), None, sent, received, **options)
                if not np.array_equal(got, expected):
                    failures.append(f"thread {thread} call {call}: not the blocks sent")
        except Exception as error:  # a failure in a thread must reach the assertion
            failures.append(f"thread {thread}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for own in comms:
        own.Free()
    assert_everywhere(comm, failures)


ALLTOALLS = HAMMER.replace("hammer", "alltoalls_given_counts")


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("nranks", [2, 3])
def test_threads_on_communicators_of_their_own_exchange_the_counts_of_their_alltoalls_apart(nranks):
    run = run_mpiexec(nranks, "-c", textwrap.dedent(ALLTOALLS), os.path.dirname(__file__), timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("start", ["new", "after-call"])
@pytest.mark.parametrize("nranks", [2, 3])
def test_two_threads_in_calls_on_one_communicator_get_an_error_on_every_rank_and_no_wrong_result(nranks, start):
    script = Path(__file__).parent.parent / "scripts" / "threads-on-one-communicator.py"
    run = run_mpiexec(nranks, str(script), "--start", start, "--calls", "40", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in range(nranks):
        assert f"rank {rank}: two threads named, 0 wrong" in run.stdout, run.stdout


TAKING_TURNS = """
    import sys, threading
    import numpy as np
    from mpi4py import MPI
    import ringtree
    from ringtree.allreduce import allreduce
    from ringtree.runtime.session.state import existing_state
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    wrong, errors, confirmed = [], [], []

    def calls(k, n=20):
        try:
            for call in range(n):
                data = np.full(1 + 1000 * (call % 3), float(k * 100 + call + rank))
                wrong.append(allreduce(data, comm=comm)[0] != size * (k * 100 + call) + size * (size - 1) / 2)
                confirmed.append(existing_state(comm).threads_bit != 0)
        except ringtree.MismatchError as error:
            errors.append(str(error))

    calls(0)  # the main thread, then two others in turn, then the main thread again: legal, as in MPI
    for k, n in ((1, 20), (2, 70)):
        if sys.argv[1] == "every rank" or rank == 0:
            thread = threading.Thread(target=calls, args=(k, n))
            thread.start()
            thread.join()
        else:
            calls(k, n)
        if errors:
            break
    if not errors:
        calls(3)
    turns = [sum(confirmed[20 * k:20 * k + 20]) for k in range(2)] + [sum(confirmed[40:110]), sum(confirmed[110:])]
    print(f"rank {rank}: {errors[0] if errors else f'{sum(wrong)} wrong of {len(wrong)}; confirmed {turns}'}")
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("nranks", [2, 3])
def test_threads_that_take_turns_on_one_communicator_in_the_same_order_on_every_rank_get_right_results(nranks):
    # Each hand-over to another thread has its next 64 calls confirmed (runtime/session/one_caller.py), no more.
    _every_rank_says(nranks, TAKING_TURNS, "0 wrong of 130; confirmed [0, 20, 64, 20]", "every rank")


HANDED_ON = """
    import queue, threading, time
    import numpy as np
    from mpi4py import MPI
    from ringtree.allreduce import allreduce, iallreduce
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    handed, wrong, errors = queue.Queue(), [], []

    def total(call):
        return size * call + size * (size - 1) // 2

    def waiter():
        try:
            for request, call in iter(handed.get, None):
                wrong.append(not (request.wait() == total(call)).all())
        except Exception as error:
            errors.append(f"{type(error).__name__}: {error}")

    def caller():
        try:
            for call in range(300):
                big = np.full(1 << 15, rank + call)  # in 64 messages, which the waiter's polls move on
                handed.put((iallreduce(big, comm=comm, algorithm="ring", segment=1 << 12), call))
                time.sleep(np.random.default_rng((rank, call)).uniform(0, 0.002))  # at any point of that call
                small = np.full(128, rank + call)
                allreduce(MPI.IN_PLACE, small, comm=comm, algorithm="ring")
                wrong.append(not (small == total(call)).all())
        except Exception as error:
            errors.append(f"{type(error).__name__}: {error}")
        handed.put(None)

    threads = [threading.Thread(target=waiter), threading.Thread(target=caller)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"rank {rank}: {errors[0] if errors else f'{sum(wrong)} wrong of {len(wrong)}'}")
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_small_call_while_another_thread_waits_on_a_request_on_its_communicator_takes_none_of_its_messages(nranks):
    # A small blocking call runs a step at a time only once no collective of the engine runs: its
    # receives take any tag, and would take the request's messages (runtime/engine/stepwise.py).
    _every_rank_says(nranks, HANDED_ON, "0 wrong of 600")


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
def test_ranks_where_different_numbers_of_threads_call_on_a_communicator_are_told_so():
    # Rank 0 hands its calls to other threads, rank 1 makes them itself: rank 0 then confirms each
    # call's end (runtime/session/one_caller.py) and rank 1 would not, which both must hear of.
    _every_rank_says(2, TAKING_TURNS, "ringtree allreduce on rank", "rank 0 only")
    run = run_mpiexec(2, "-c", textwrap.dedent(TAKING_TURNS), "rank 0 only", timeout=120)
    assert run.stdout.count("a call of another thread on it among the last calls: yes on rank 0; no on rank 1") == 2, \
        run.stdout


FIRST_CALLS_AT_ONCE = """
    import sys, threading
    import numpy as np
    from mpi4py import MPI
    sys.setswitchinterval(1e-6)  # threads switch between any two steps of a call
    import ringtree
    comm = MPI.COMM_WORLD
    comms = [comm.Dup() for _ in range(4)]
    barrier, errors, wrong = threading.Barrier(4), [], []

    def work(k):
        local = comms[k]
        try:
            barrier.wait()
            for call in range(8):
                kind = (k + call) % 4
                if kind == 0:
                    got, expected = ringtree.allreduce(np.ones(1), comm=local, timeout=60), [comm.size]
                elif kind == 1:
                    got, expected = ringtree.broadcast(np.full(2, comm.rank), 0, comm=local, timeout=60), [0, 0]
                elif kind == 2:
                    got, expected = ringtree.reduce_scatter(np.ones(comm.size), comm=local, timeout=60), [comm.size]
                else:
                    got, expected = ringtree.iallreduce(np.ones(3), comm=local).wait(), [comm.size] * 3
                if got.tolist() != expected:
                    wrong.append(f"thread {k} call {call}: {got} != {expected}")
        except Exception as error:
            errors.append(f"thread {k}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"rank {comm.rank}: {len(wrong)} wrong, {len(errors)} errors {(wrong + errors)[:1]}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_threads_that_make_their_first_calls_at_once_on_communicators_of_their_own_get_no_error(nranks):
    # Only the first thread to call ringtree takes in_call's first-thread way, which ends a
    # communicator's first call with every rank's confirmation; two that both took it (the first
    # thread was known only once a call's checks noted it) could confirm a call on one rank and not on
    # another: a MismatchError, or without a timeout a hang. Jobs of their own: a process's first calls
    # at once, in three processes, as one of them may happen not to meet the race.
    for _ in range(3):
        _every_rank_says(nranks, FIRST_CALLS_AT_ONCE, "0 wrong, 0 errors")


FIRST_CALLS_AGAIN_AND_AGAIN = """
    import faulthandler, sys, threading
    import numpy as np
    from mpi4py import MPI
    sys.setswitchinterval(1e-6)
    faulthandler.dump_traceback_later(100, exit=True)  # a hang shows every thread's stack, then ends
    import ringtree
    comm, rounds = MPI.COMM_WORLD, int(sys.argv[1])
    errors, wrong = [], []

    def work(k, mine):
        try:
            for call, local in enumerate(mine):  # the first call on each: its set-up, then its confirmation
                kind = (k + call) % 4
                if kind == 0:
                    got, expected = ringtree.allreduce(np.ones(1), comm=local), [comm.size]
                elif kind == 1:
                    got, expected = ringtree.broadcast(np.full(2, comm.rank), 0, comm=local, timeout=60), [0, 0]
                elif kind == 2:
                    got, expected = ringtree.allreduce(np.ones(1 << 16), comm=local)[:1], [comm.size]
                else:
                    got, expected = ringtree.iallreduce(np.ones(3), comm=local).wait(), [comm.size] * 3
                if got.tolist() != expected:
                    wrong.append(f"thread {k} call {call}: {got} != {expected}")
        except Exception as error:
            errors.append(f"thread {k}: {type(error).__name__}: {error}")

    for _ in range(rounds):
        comms = [[comm.Dup() for _ in range(2)] for _ in range(4)]  # in one order on every rank
        threads = [threading.Thread(target=work, args=(k, comms[k])) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for local in sum(comms, []):
            local.Free()
    faulthandler.cancel_dump_traceback_later()
    print(f"rank {comm.rank}: {len(wrong)} wrong, {len(errors)} errors in {rounds} rounds {(wrong + errors)[:1]}",
          flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
@pytest.mark.parametrize("nranks, rounds", [(2, 200), (3, 100), (4, 100)])
def test_threads_that_set_up_communicators_of_their_own_round_after_round_never_hang(nranks, rounds):
    # Each round, four threads each make the first calls on two new communicators: every set-up's
    # collectives (the private duplicates, the node split, the first call's confirmation) while the
    # other threads' are in flight. A set-up step taken in another order on one rank would hang.
    _every_rank_says(nranks, FIRST_CALLS_AGAIN_AND_AGAIN, f"0 wrong, 0 errors in {rounds} rounds", str(rounds))


def _every_rank_says(nranks, script, words, *arguments) -> None:
    """Run `script` with `arguments` on `nranks` ranks; every rank's line of output reads "rank R: `words`"."""
    run = run_mpiexec(nranks, "-c", textwrap.dedent(script), *arguments, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in range(nranks):
        assert f"rank {rank}: {words}" in run.stdout, run.stdout
