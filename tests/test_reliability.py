"""Errors instead of hangs: check mode, timeouts, a rank that never comes, a rank that dies."""

import pathlib
import textwrap
import time

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
import ringtree.settings
from conftest import assert_everywhere, run_mpiexec
from ringtree.algorithms import ALGORITHMS
from ringtree.allreduce import allreduce, iallreduce

one_rank_only = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")


def _call(kind, rank, odd):
    """One rank's allreduce for mismatch `kind`; the `odd` rank's differs."""
    data = np.arange(12, dtype=np.float32)
    if kind == "count":
        return lambda comm: allreduce(data[:11] if rank == odd else data, comm=comm, check=True)
    if kind == "dtype":
        return lambda comm: allreduce(data.astype(np.float64) if rank == odd else data, comm=comm, check=True)
    if kind == "op":
        return lambda comm: allreduce(data, op=MPI.MAX if rank == odd else MPI.SUM, comm=comm, check=True)
    if kind == "algorithm":
        return lambda comm: allreduce(data, comm=comm, algorithm="tree" if rank == odd else "ring", check=True)
    # "skip": the odd rank skips a call of 12 elements and goes on to the next, of 6
    def skipping(comm):
        if rank != odd:
            allreduce(data, comm=comm, check=True)
        allreduce(data[:6], comm=comm, check=True)
    return skipping


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["count", "dtype", "op", "algorithm", "skip"])
def test_check_mode_raises_each_mismatch_on_every_rank(kind):
    world = MPI.COMM_WORLD
    comm, rank = world.Dup(), world.Get_rank()
    odd = world.Get_size() - 1
    field = {"skip": "count", "algorithm": "algorithm"}.get(kind, kind)
    started = time.perf_counter()
    try:
        _call(kind, rank, odd)(comm)
        failures = [f"{kind}: no MismatchError"]
    except ringtree.MismatchError as error:
        text = str(error)
        failures = [] if f"{field}: " in text and f"rank {odd}" in text else [f"{kind}: vague error: {text}"]
    elapsed = time.perf_counter() - started
    if elapsed > 10:
        failures.append(f"{kind}: took {elapsed:.1f} s")
    assert_everywhere(world, failures)
    # Nothing was sent before the check: the communicator still works.
    data = np.arange(5, dtype=np.int64) + rank
    expected = np.empty_like(data)
    world.Allreduce(data, expected)
    assert_everywhere(world, [] if np.array_equal(allreduce(data, comm=comm, check=True), expected) else ["after"])
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_check_mode_lets_matching_calls_through(comm):
    rank = comm.Get_rank()
    requests, expected = [], []
    for count in (1, 1000, 300_000):
        data = (np.arange(count) % 5 + rank).astype(np.int32)
        native = np.empty_like(data)
        comm.Allreduce(data, native)
        expected.append(native)
        requests.append(iallreduce(data, comm=comm, check=True))
    results = [request.wait() for request in requests]
    assert_everywhere(comm, [count for count, (a, b) in enumerate(zip(results, expected)) if not np.array_equal(a, b)])


MISMATCHES = """
    import sys, time
    import numpy as np
    from mpi4py import MPI
    import ringtree
    import ringtree.runtime.engine.stepwise
    from ringtree.algorithms import ALGORITHMS
    from ringtree.allreduce import allreduce
    world, kind = MPI.COMM_WORLD, sys.argv[1]
    if sys.argv[2:] == ["probe first"]:  # as under an MPI that truncates unsafely (runtime/engine/stepwise.py)
        ringtree.runtime.engine.stepwise.PROBE_FIRST = True
    rank, odd = world.Get_rank(), world.Get_size() - 1
    for algorithm in ["auto", *ALGORITHMS]:
        for count in (4, 300_000):
            comm = world.Dup()
            allreduce(np.ones(3), comm=comm)  # set up, so that the time below is the mismatch's
            # As the issue found them: the odd rank's int32 where the others pass float32 (the same
            # bytes), MAX where they pass SUM, one element fewer, or another algorithm.
            data, arguments = np.arange(count, dtype=np.float32) % 7, dict(algorithm=algorithm)
            if rank == odd:
                if kind == "count":
                    data = data[:-1]
                elif kind == "dtype":
                    data = data.view(np.int32)
                elif kind == "op":
                    arguments["op"] = MPI.MAX
                else:
                    arguments["algorithm"] = "tree" if algorithm == "ring" else "ring"
            started = time.perf_counter()
            try:
                for _ in range(3):  # the first call of each kind makes its plan; the next ones reuse it
                    allreduce(data, comm=comm, **arguments)
                outcome = "no MismatchError"
            except ringtree.MismatchError as error:
                text = str(error)
                outcome = "named" if f"{kind}: " in text and f"on rank {odd}" in text else f"vague: {text}"
            except Exception as error:
                outcome = f"{type(error).__name__}: {error}"
            elapsed = time.perf_counter() - started
            try:
                allreduce(data, comm=comm, **arguments)
                after = "a call after it went through"
            except ringtree.MismatchError as error:
                after = "unusable" if "unusable" in str(error) else f"after: {error}"
            lines = world.gather(f"{algorithm} {count} rank {rank}: {outcome}, {after}, {elapsed:.2f} s")
            if rank == 0:  # one rank prints: lines of several could interleave
                print("\\n".join(lines), flush=True)
"""


@pytest.mark.slow
@one_rank_only
@pytest.mark.parametrize("receives", ["", "probe first"])
@pytest.mark.parametrize("nranks", [2, 3, 5])
@pytest.mark.parametrize("kind", ["count", "dtype", "op", "algorithm"])
def test_by_default_a_mismatch_raises_on_every_rank_naming_the_ranks_and_what_differs(kind, nranks, receives):
    # A job per kind and rank count: each mismatch leaves a communicator that is never freed.
    if receives and (nranks != 3 or not MPI.Get_library_version().startswith("MPICH")):
        pytest.skip("the probe-first receives run by default under other MPIs; once under MPICH, at 3 ranks")
    run, _ = _run_script(nranks, MISMATCHES, kind, receives, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == nranks * 2 * (1 + len(ALGORITHMS)), run.stdout + run.stderr
    for line in lines:
        where, outcome = line.split(": ", 1)
        assert outcome.startswith("named, unusable, ") and float(outcome.split(", ")[2].split()[0]) < 10, line


@pytest.mark.mpi
def test_with_signatures_off_small_repeats_are_still_kept_bound_and_right(monkeypatch):
    """Without signatures no call's end is confirmed (one_caller.py), so the wait for the first call's
    confirmation before keeping a run bound (again.keep_again) must not apply: repeats on the same
    small arrays still run bound to them, each result MPI's own."""
    from ringtree.runtime.session.again import kept_runs

    monkeypatch.setenv("RINGTREE_SIGNATURES", "0")
    ringtree.settings.reload()
    world = MPI.COMM_WORLD
    comm, failures = world.Dup(), []
    data, out, expected = np.empty(4, np.int64), np.empty(4, np.int64), np.empty(4, np.int64)
    try:
        for call in range(200):  # past online tuning's trials of the shape
            data[:] = np.arange(4) * (world.Get_rank() + 1) + call
            allreduce(data, out, comm=comm)
            world.Allreduce(data, expected)
            if not np.array_equal(out, expected):
                failures.append(f"call {call}: {out} != {expected}")
                break
        if kept_runs(comm)["allreduce"].get(id(out)) is None:
            failures.append("not kept bound")
    finally:
        monkeypatch.delenv("RINGTREE_SIGNATURES")
        ringtree.settings.reload()
    assert_everywhere(world, failures)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_with_signatures_off_a_message_of_the_wrong_size_is_still_an_error_not_a_result(monkeypatch):
    monkeypatch.setenv("RINGTREE_SIGNATURES", "0")
    ringtree.settings.reload()
    world = MPI.COMM_WORLD
    comm, rank, odd = world.Dup(), world.Get_rank(), world.Get_size() - 1
    data = np.ones(40 + 8 * (rank == odd), np.float32)
    try:
        allreduce(data, comm=comm, algorithm="ring", timeout=2.0)
        outcome = "a result"
    except ringtree.MismatchError:
        outcome = "mismatch"
    except ringtree.TimeoutError:
        outcome = "timeout"  # a rank whose neighbours stopped
    finally:
        monkeypatch.delenv("RINGTREE_SIGNATURES")
        ringtree.settings.reload()
    outcomes = world.allgather(outcome)
    assert_everywhere(world, [] if "a result" not in outcomes and "mismatch" in outcomes else [outcomes])
    world.Barrier()
    comm.Free()


def test_bad_check_and_timeout_arguments_are_refused():
    data = np.ones(3)
    with pytest.raises(TypeError, match="check must be True, False or None"):
        allreduce(data, check="yes")
    for bad in (0, -1.0, "5", True):
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
            allreduce(data, timeout=bad)


def _run_script(nranks, script, *args, env=None, timeout=120):
    """Run `script` on `nranks` ranks under mpiexec; return the completed process and the seconds it took."""
    started = time.perf_counter()
    run = run_mpiexec(nranks, "-c", textwrap.dedent(script), *args, env=env, timeout=timeout)
    return run, time.perf_counter() - started


NEVER_JOINS = """
    import pathlib, sys, time
    import numpy as np
    from mpi4py import MPI
    import ringtree
    import ringtree.settings
    from ringtree.allreduce import allreduce
    comm, folder = MPI.COMM_WORLD, pathlib.Path(sys.argv[2])
    timeout = None if sys.argv[1] == "env" else float(sys.argv[1])  # "env": RINGTREE_TIMEOUT sets it
    check, broadcast = "check" in sys.argv[3:], "broadcast" in sys.argv[3:]
    rank, missing = comm.Get_rank(), comm.Get_size() - 1
    allreduce(np.ones(4))  # sets the communicator up: every rank takes part
    if rank == missing:
        time.sleep((timeout or ringtree.settings.current().timeout) + 3)  # never joins the next collective
    else:
        report = []
        started = time.perf_counter()
        try:
            if broadcast:
                # every rank waits on every other (a binomial tree's would be done): no comparison first
                ringtree.broadcast(np.ones(100_000, np.float32), algorithm="scatter_allgather", timeout=timeout,
                                   check=False)
            else:
                allreduce(np.ones(777 if check else 100_000, np.float32), timeout=timeout, check=check)
        except ringtree.TimeoutError as error:
            report.append(f"after {time.perf_counter() - started:.2f} s: {error}")
        try:
            allreduce(np.ones(4), timeout=timeout)
        except ringtree.TimeoutError as error:
            report.append(f"next call: {error}")
        (folder / f"rank-{rank}.txt").write_text("\\n".join(report))  # files, as mpiexec may interleave output lines
"""


@pytest.mark.slow
@one_rank_only
@pytest.mark.parametrize("nranks, how, collective", [(2, "argument", "allreduce"), (4, "argument", "allreduce"),
                                                     (3, "environment", "allreduce"), (3, "argument", "broadcast")])
def test_a_rank_that_never_joins_is_named_on_every_other_rank_within_the_timeout_and_a_second(nranks, how, collective,
                                                                                               tmp_path):
    timeout = 2.0
    if how == "argument":
        run, _ = _run_script(nranks, NEVER_JOINS, str(timeout), str(tmp_path), collective)
    else:
        run, _ = _run_script(nranks, NEVER_JOINS, "env", str(tmp_path), env={"RINGTREE_TIMEOUT": str(timeout)})
    assert run.returncode == 0, run.stdout + run.stderr
    missing = nranks - 1
    for rank in range(missing):
        after, following = (tmp_path / f"rank-{rank}.txt").read_text().split("\n")
        seconds = float(after.split()[1])
        assert timeout <= seconds <= timeout + 1, after
        assert after.split(": ", 1)[1].startswith(f"ringtree {collective} #"), after  # whichever collective it was
        assert f"not in any ringtree collective on this communicator: rank {missing}" in after, after
        assert "made no progress for 2 s; it waits for op" in after, after
        assert following.startswith(f"next call: ringtree on rank {rank}: this communicator is unusable"), following


@pytest.mark.slow
@one_rank_only
def test_in_check_mode_the_timeout_names_the_users_call_and_the_rank_that_never_joins(tmp_path):
    run, _ = _run_script(3, NEVER_JOINS, "2", str(tmp_path), "check")
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in range(2):
        after, following = (tmp_path / f"rank-{rank}.txt").read_text().split("\n")
        assert "(777 elements of float32, sum, algorithm auto): not every rank came to check mode" in after, after
        assert "not in any ringtree collective on this communicator: rank 2" in after, after
        assert "recursive_doubling" not in after and "10 elements" not in after, after
        assert following.startswith(f"next call: ringtree on rank {rank}: this communicator is unusable"), following
        assert "777 elements" in following and "recursive_doubling" not in following, following


@pytest.mark.slow
@one_rank_only
def test_RINGTREE_CHECK_turns_check_mode_on_for_every_call():
    script = """
        import numpy as np
        from mpi4py import MPI
        import ringtree
        from ringtree.allreduce import allreduce
        rank = MPI.COMM_WORLD.Get_rank()
        try:
            allreduce(np.ones(10 + rank, np.float32))
        except ringtree.MismatchError as error:
            print(f"rank {rank}: {error}", flush=True)
    """
    run, _ = _run_script(2, script, env={"RINGTREE_CHECK": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in range(2):
        assert f"ringtree allreduce on rank {rank}: the ranks of ringtree(MPI_COMM_WORLD) disagree at call #0: " \
               "count: 10 on rank 0; 11 on rank 1" in run.stdout, run.stdout


@pytest.mark.slow
def test_first_call_on_a_communicator_times_out_too():
    script = """
        import sys, time
        import numpy as np
        from mpi4py import MPI
        import ringtree
        from ringtree.allreduce import allreduce
        comm = MPI.COMM_WORLD
        if comm.Get_rank() == 1:
            time.sleep(4)
        else:
            try:
                allreduce(np.ones(4), timeout=1.0)
            except ringtree.TimeoutError as error:
                print(error, flush=True)
    """
    if MPI.COMM_WORLD.Get_size() > 1:
        pytest.skip("starts its own mpiexec; run on one rank")
    run, _ = _run_script(2, script)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "not every rank of MPI_COMM_WORLD came to its first ringtree collective within 1 s" in run.stdout


LATE = """
    import time
    import numpy as np
    from mpi4py import MPI
    import ringtree
    world = MPI.COMM_WORLD
    rank, late, timeout = world.Get_rank(), world.Get_size() - 1, 0.5
    pairs = np.zeros(2, np.dtype([("value", "f8"), ("rank", "i4")], align=True))

    def allreduce(comm, algorithm, **options):
        return lambda: ringtree.allreduce(np.ones(100, np.float32), comm=comm, algorithm=algorithm, **options)

    # Each way a timed call can run: the engine's algorithms, auto committed (online tuning's choice
    # kept, as from a warm cache) and in a trial's barrier, check mode's comparison, a broadcast,
    # a call MPI's own computes, an empty call.
    cases = {name: (lambda comm, name=name: allreduce(comm, name, timeout=timeout), 0)
             for name in ("ring", "tree", "recursive_doubling", "rabenseifner", "double_tree")}
    cases["auto, committed"] = (lambda comm: allreduce(comm, "auto", timeout=timeout), 300)
    cases["auto, a trial"] = (lambda comm: allreduce(comm, "auto", timeout=timeout), 0)
    cases["check mode"] = (lambda comm: allreduce(comm, "recursive_doubling", timeout=timeout, check=True), 0)
    cases["broadcast"] = (lambda comm: lambda: ringtree.broadcast(np.ones(50), timeout=timeout, comm=comm), 0)
    cases["MAXLOC"] = (lambda comm: lambda: ringtree.allreduce([pairs, MPI.DOUBLE_INT], op=MPI.MAXLOC, timeout=timeout,
                                                              comm=comm), 1)
    cases["empty"] = (lambda comm: lambda: ringtree.allreduce(np.ones(0), timeout=timeout, comm=comm), 1)
    for label, (made, before) in cases.items():
        comm = world.Dup()
        call = made(comm)
        ringtree.allreduce(np.ones(3), comm=comm)  # sets up
        for _ in range(before):  # the same call, in step: as a program's earlier steps
            call()
        world.Barrier()
        if rank == late:
            time.sleep(timeout + 0.8)
        started = time.perf_counter()
        try:
            call()
            outcome = "returned"
        except ringtree.TimeoutError as error:
            outcome = "given up by another" if "gave this call up after its timeout" in str(error) else f"timed out ({error})"
        try:
            call()
            after = "the next call returned"
        except (ringtree.TimeoutError, ringtree.MismatchError) as error:
            after = "unusable" if "unusable after" in str(error) else f"the next call: {error}"
        elapsed = time.perf_counter() - started
        lines = world.gather(f"{label}, rank {rank}: {outcome}, {after}, {elapsed:.1f} s")
        if rank == 0:
            print("\\n".join(lines), flush=True)
"""


@pytest.mark.slow
@one_rank_only
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_timeout_leaves_every_rank_in_the_same_state_the_late_one_too(nranks):
    # Both ranks call with a timeout, the last rank comes later than it: the others time out, and it
    # raises too, though the messages it needed may all have arrived.
    run, _ = _run_script(nranks, LATE, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 11 * nranks, run.stdout + run.stderr
    for line in lines:
        rank, outcome = line.split(", rank ", 1)[1].split(": ", 1)
        what, after, seconds = outcome.rsplit(", ", 2)
        assert what == "given up by another" or int(rank) < nranks - 1 and what.startswith("timed out"), line
        assert after == "unusable" and float(seconds.split()[0]) < 5, line


DIES = """
    import os, time
    import numpy as np
    from mpi4py import MPI
    from ringtree.allreduce import iallreduce
    rank = MPI.COMM_WORLD.Get_rank()
    request = iallreduce(np.ones(16 << 20, np.float32))  # 64 MiB, pipelined
    if rank == 1:
        request.test()
        os._exit(3)  # in the middle of it
    request.wait()
"""


@pytest.mark.slow
@one_rank_only
def test_a_rank_that_dies_mid_allreduce_ends_the_job_with_an_error():
    run, seconds = _run_script(3, DIES, timeout=90)
    assert run.returncode != 0
    assert seconds < 60, f"took {seconds:.1f} s"


DIES_AND_REPORTS = """
    import os, pathlib, sys
    import numpy as np
    from mpi4py import MPI
    import ringtree
    rank = MPI.COMM_WORLD.Get_rank()
    request = ringtree.iallreduce(np.ones(16 << 20, np.float32))
    if rank == 1:
        request.test()
        os._exit(3)
    try:
        request.wait()
    except ringtree.PeerFailure as error:
        pathlib.Path(sys.argv[1], f"rank-{rank}.txt").write_text(str(error))  # the job's abort may cut its output
        raise
"""


@pytest.mark.slow
@one_rank_only
@pytest.mark.skipif("MPICH" not in MPI.Get_library_version(), reason="-disable-auto-cleanup is MPICH's launcher's")
def test_a_rank_that_dies_is_named_and_the_job_ends_even_when_the_launcher_would_not_end_it(tmp_path):
    # The launcher does not always end the job when a rank dies, and a survivor's MPI_Finalize then
    # waits for the dead rank forever: without the launcher's clean-up, only ringtree can end the job.
    started = time.perf_counter()
    run = run_mpiexec(3, "-c", textwrap.dedent(DIES_AND_REPORTS), str(tmp_path), options=["-disable-auto-cleanup"],
                      timeout=90)
    assert run.returncode != 0
    assert time.perf_counter() - started < 60
    reports = [path.read_text() for path in sorted(tmp_path.glob("rank-*.txt"))]
    assert reports, run.stderr
    for report in reports:
        assert "the MPI failed a message with rank 1" in report, report
        assert "ringtree ends the job (MPI_Abort) when this process exits" in report, report


@pytest.mark.slow
@one_rank_only
@pytest.mark.skipif("Open MPI" not in MPI.Get_library_version(),
                    reason="ULFM fault tolerance is Open MPI's (mpiexec --with-ft ulfm); this MPI is another")
def test_survivors_get_peer_failure_and_go_on_with_a_shrunk_communicator(tmp_path):
    example = pathlib.Path(__file__).parents[1] / "examples" / "shrink.py"
    started = time.perf_counter()
    run = run_mpiexec(4, str(example), "--fail-rank", "1", "--fail-step", "2", "--steps", "5", timeout=120,
                      options=["--with-ft", "ulfm", "--mca", "btl", "self,tcp",
                               "--output-filename", str(tmp_path / "out")])  # a file per rank: no interleaved lines
    assert time.perf_counter() - started < 60
    for rank in (0, 2, 3):
        output = "".join(path.read_text() for path in tmp_path.glob(f"out*.{rank}.out"))
        assert f"rank {rank}, step 2: ringtree allreduce on rank {rank}: rank 1 failed" in output, output + run.stderr
        assert f"rank {rank}: 5 steps done on 3 ranks, every average right" in output, output + run.stderr


STALLS = """
    import sys, time
    import numpy as np
    from mpi4py import MPI
    from ringtree.allreduce import allreduce
    rank = MPI.COMM_WORLD.Get_rank()
    small, out = np.ones(4, np.float32), np.empty(4, np.float32)
    allreduce(small, out, algorithm="recursive_doubling")  # sets up; the next call on these arrays is a repeat
    pairs = np.zeros(2, np.dtype([("value", "f8"), ("rank", "i4")], align=True))
    calls = {"repeat": lambda: allreduce(small, out, algorithm="recursive_doubling"),
             "stepwise": lambda: allreduce(np.ones(8), algorithm="tree"),
             "engine": lambda: allreduce(np.ones(1 << 18), algorithm="ring", segment=1 << 16),
             "tuning": lambda: allreduce(np.ones(3)),
             "MPI's own": lambda: allreduce([pairs, MPI.DOUBLE_INT], op=MPI.MAXLOC)}
    for label, call in calls.items():
        if rank == 1:
            time.sleep(float(sys.argv[1]))  # late, by more than the warning's interval
        print(f"rank {rank} starts {label}", file=sys.stderr, flush=True)
        call()
"""


@pytest.mark.slow
@one_rank_only
def test_a_rank_that_waits_with_no_progress_warns_at_each_interval_naming_whom_it_waits_for():
    run, _ = _run_script(2, STALLS, "2.6", env={"RINGTREE_STALL_WARNING": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    sections = run.stderr.split("rank 0 starts ")[1:]
    assert len(sections) == 5, run.stderr
    waits = {"tuning": "barrier that starts a tuning trial", "MPI's own": "MPI.MAXLOC, algorithm auto), in MPI's own"}
    for label, section in zip(("repeat", "stepwise", "engine", "tuning", "MPI's own"), sections):
        warnings = [line for line in section.splitlines() if "no progress for" in line]
        assert len(warnings) >= 2 and all("on rank 0 of ringtree(MPI_COMM_WORLD)" in w for w in warnings), section
        assert "no progress for 1 s" in warnings[0] and "no progress for 2 s" in warnings[1], section
        assert all(waits.get(label, "it waits for rank 1") in w for w in warnings), section
    assert not [line for line in run.stderr.splitlines() if "on rank 1 of" in line]  # it never waited long
    quiet, _ = _run_script(2, STALLS, "1.5", env={"RINGTREE_STALL_WARNING": "off"})
    assert quiet.returncode == 0 and "no progress" not in quiet.stderr, quiet.stderr


THREAD_STALLS = """
    import sys, threading, time
    import numpy as np
    from mpi4py import MPI
    from ringtree.allreduce import allreduce
    world = MPI.COMM_WORLD
    rank, comms = world.Get_rank(), [world.Dup() for _ in range(2)]
    for comm in comms:
        allreduce(np.ones(4), comm=comm)  # sets up

    def work(k):
        if rank == 1 and k == 1:
            time.sleep(2.6)  # late on the second thread's communicator only
        allreduce(np.ones(1 << 16), comm=comms[k], algorithm="ring", segment=1 << 14)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
"""


@pytest.mark.slow
@one_rank_only
def test_a_stall_in_one_thread_warns_while_another_thread_is_not_stalled():
    run, _ = _run_script(2, THREAD_STALLS, env={"RINGTREE_STALL_WARNING": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    warnings = [line for line in run.stderr.splitlines() if "no progress for" in line]
    assert warnings and all("on rank 0 of ringtree(comm)" in w and "it waits for rank 1" in w for w in warnings), run.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("others", ["ring", "auto"])
def test_a_rank_that_names_native_where_the_others_do_not_gets_a_mismatch_on_every_rank(comm, others):
    if comm.size < 2:
        pytest.skip("needs ranks that differ")
    local = comm.Dup()  # a mismatch leaves it unusable
    try:
        allreduce(np.ones(8), comm=local, algorithm="native" if comm.rank == 0 else others)
        outcome = "no MismatchError"
    except ringtree.MismatchError as error:
        outcome = "named" if "algorithm: 'native' on rank 0" in str(error) else f"vague: {error}"
    assert_everywhere(comm, [] if outcome == "named" else [outcome])


def test_signatures_tell_apart_every_dtype_op_and_algorithm_and_tags_fit_the_mpi():
    from ringtree.ops import ReduceOp
    from ringtree.runtime.safety.mismatch import TagLayout, signature
    dtypes = [np.dtype(c) for c in "?bBhHiIlLqQefdgFDG"] + [np.dtype(">f4")]
    codes = {signature(10, d, "sum", "auto", None).code for d in dtypes}
    assert len(codes) == len(dtypes)
    assert len({signature(10, np.dtype("f4"), op.value, "auto", None).code for op in ReduceOp}) == len(ReduceOp)
    algorithms = ["auto", "native", *ALGORITHMS]
    assert len({signature(10, np.dtype("f4"), "sum", a, None).code for a in algorithms}) == len(algorithms)
    for tag_ub in (32767, (1 << 29) - 1, (1 << 31) - 1):
        layout = TagLayout.of(tag_ub)
        highest = max(layout.tag(layout.calls - 1, (1 << 16) - 1), layout.notice_of(layout.codes - 1))
        assert highest <= tag_ub and layout.tag(layout.calls - 1, 0) < layout.notice
        assert layout.tag(5, 7) != layout.tag(6, 7) and not layout.stale(layout.notice_of(5), 5)
        assert layout.stale(layout.notice_of(4), 5)
