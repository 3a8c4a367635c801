"""Online tuning: trials in turn, one choice committed on every rank from the slowest rank's times, and
the cache that keeps it for the next job."""

import json
import textwrap

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere, run_mpiexec, same_on_all_ranks
from ringtree import settings
from ringtree.algorithms import ALGORITHMS
from ringtree.runtime.engine import native
from ringtree.runtime.session import again
from ringtree.runtime.session.state import comm_state
from ringtree.tuning import cache
from ringtree.tuning.model import Params
from ringtree.tuning.online import (
    MAX_SCHEDULES,
    NATIVE,
    SEGMENTS_ACROSS_NODES,
    UNSPLIT_MAX_BYTES,
    Key,
    Option,
    Tuner,
    key_of,
    options_for,
    trials,
)

PARAMS = Params(alpha=1e-5, beta=3e-10, gamma=2e-10)


@pytest.mark.parametrize("nbytes", [8, 4096, 1 << 20, 64 << 20])
@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_the_candidates_are_the_same_for_every_call_of_a_key_and_native_comes_last_where_allowed(nbytes, nranks):
    with_native = options_for(key_of(nbytes, False, 4, True), nranks, PARAMS)
    without = options_for(key_of(nbytes, False, 4, False), nranks, PARAMS)
    assert with_native == without + [Option(NATIVE, 0)]
    assert options_for(key_of(nbytes + 1 if nbytes > 8 else 9, False, 4, False), nranks, PARAMS) == without
    assert 1 <= len(without) <= MAX_SCHEDULES and len(set(without)) == len(without)
    assert all(option.segment < 1 << nbytes.bit_length() for option in without)  # a call applies it if larger


@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 64 << 20])
@pytest.mark.parametrize("nodes", [2, 3])
def test_on_several_nodes_every_algorithm_is_tried_and_the_hierarchical_allreduce_in_each_segment_size(nbytes, nodes):
    options = options_for(key_of(nbytes, False, 4, False), 4, PARAMS, nodes)
    largest = (1 << nbytes.bit_length()) - 1
    splits = [0] * (largest <= UNSPLIT_MAX_BYTES) + [s for s in SEGMENTS_ACROSS_NODES if s < largest]
    hierarchical = [option.segment for option in options if option.algorithm == "hierarchical"]
    others = [option for option in options if option.algorithm != "hierarchical"]
    assert options[0].algorithm == "hierarchical" and hierarchical == splits
    assert sorted(option.algorithm for option in others) == sorted(set(ALGORITHMS) - {"hierarchical"})
    assert {option.segment for option in others} == {256 << 10 if largest > 256 << 10 else 0}


def _tuner(committed=None, explore=True):
    commits = []
    return Tuner(2, PARAMS, committed or {}, explore, lambda key, option: commits.append((key, option))), commits


def test_each_candidate_is_tried_in_turn_then_the_fastest_by_the_combined_times_is_committed():
    tuner, commits = _tuner()
    key = key_of(4096, False, 4, True)
    options = options_for(key, 2, PARAMS)
    tried = []
    for _ in range(trials(key) * len(options)):
        option, why, trial = tuner.choose(key, None)
        assert trial is not None and why == "a trial"
        tried.append(option)
        Tuner.record(trial, 1.0 if option == options[0] else 2.0)  # this rank finds the first fastest
    assert tried == [option for option in options for _ in range(trials(key))]
    # ...but the slowest rank's times, which every rank decides from, favour the last
    option, why, trial = tuner.choose(key, lambda mine: [3.0] * (len(mine) - trials(key)) + [2.5] * trials(key))
    assert (option, why, trial) == (options[-1], "online tuning", None)
    assert commits == [(key, options[-1])]
    assert tuner.choose(key, None) == (options[-1], "online tuning", None)


def test_a_candidate_whose_calls_are_short_only_on_the_rank_that_came_late_is_not_taken_for_fast():
    # In calls in a row the ranks take turns at coming late, and the late one's call is short: each
    # rank's best alone (1.0) would say the first candidate is fastest; every call took 10 on some rank.
    tuner, _ = _tuner()
    key = key_of(1 << 18, True, 4, True)
    options = options_for(key, 2, PARAMS)
    other = []
    for call in range(trials(key) * len(options)):
        option, _, trial = tuner.choose(key, None)
        first = option == options[0]
        seconds = (1.0 if call % 2 else 10.0) if first else 5.0
        Tuner.record(trial, seconds)
        other.append((10.0 if call % 2 else 1.0) if first else 5.0)
    option, why, _ = tuner.choose(key, lambda times: [max(a, b) for a, b in zip(times, other)])
    assert option == options[1] and why == "online tuning"


def test_a_candidate_with_one_fast_call_among_slow_ones_is_not_taken_for_fast():
    # Its best call (1.0) is the shortest of all, but a call of it takes 10 as a rule: the typical
    # call (the median) decides, not the luckiest.
    tuner, _ = _tuner()
    key = key_of(1 << 15, True, 4, True)
    options = options_for(key, 2, PARAMS)
    for call in range(trials(key) * len(options)):
        option, _, trial = tuner.choose(key, None)
        Tuner.record(trial, (1.0 if call == 0 else 10.0) if option == options[0] else 5.0)
    option, why, _ = tuner.choose(key, lambda times: times)
    assert option == options[1] and why == "online tuning"


def test_without_exploring_only_committed_choices_are_given():
    cached = key_of(8, True, 8, True)
    tuner, commits = _tuner({cached: Option("tree", 0)}, explore=False)
    assert tuner.choose(cached, None) == (Option("tree", 0), "the tuning cache", None)
    assert tuner.choose(key_of(1 << 20, True, 8, True), None) is None
    assert commits == []


def test_the_cache_keeps_choices_per_identity_and_survives_a_bad_file(tmp_path):
    who = cache.identity(["b", "a", "b"], (0, 1, 0), "MPI 1", "0.1")
    assert who["hosts"] == ["a", "b"] and who["layout"] == [1, 0, 1]
    assert cache.path_for(str(tmp_path), cache.identity(["b", "a", "b"], (0, 0, 0), "MPI 1", "0.1")) != \
        cache.path_for(str(tmp_path), who)  # one host name, but other nodes: another layout
    path = cache.path_for(str(tmp_path), who)
    choices = {Key(4, False, 4, True): Option(NATIVE, 0), Key(23, True, 4, False): Option("ring", 1 << 20)}
    cache.write(path, who, choices)
    assert cache.parse(cache.read(path), who) == choices
    assert cache.parse(cache.read(path), {**who, "mpi": "MPI 2"}) == {}  # another MPI: a file of its own
    assert cache.path_for(str(tmp_path), {**who, "mpi": "MPI 2"}) != path
    cache.write(path, who, {Key(5, False, 4, True): Option("tree", 0)})  # merges with what is there
    assert len(cache.parse(cache.read(path), who)) == 3
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    path.write_text("{not json")
    assert cache.parse(cache.read(path), who) == {}
    assert cache.read(tmp_path / "missing.json") == ""


@pytest.mark.mpi
def test_ranks_that_measure_differently_still_commit_the_same_choices_and_every_call_is_right(monkeypatch):
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    comm = world.Dup()  # a communicator of its own: a fresh tuner
    honest = Tuner.record

    def skewed(trial, seconds):  # each rank finds another candidate 100 times slower than it was
        exploration, index = trial
        honest(trial, seconds * (100 if index % world.Get_size() == rank else 1))

    monkeypatch.setattr(Tuner, "record", staticmethod(skewed))
    failures = []
    rng = np.random.default_rng(rank)
    for count in (3, 1000, 1 << 17):
        for call in range(100):  # 50 of each key: enough to try every candidate trials(key) times
            data = rng.integers(-1000, 1000, count).astype(np.int64)
            expected = np.empty_like(data)
            world.Allreduce(data, expected)
            if call % 2:
                result = ringtree.allreduce(data, comm=comm)
            else:
                result = data.copy()
                ringtree.allreduce(MPI.IN_PLACE, result, comm=comm)
            if not np.array_equal(result, expected):
                failures.append(f"count {count}, call {call}")
    tuner = comm_state(comm).tuner
    # An earlier test's communicator of this size may have left choices in the cache: they count too.
    keys = [key_of(count * 8, in_place, 8, True) for count in (3, 1000, 1 << 17) for in_place in (False, True)]
    committed = [(key, tuner.committed.get(key)) for key in keys]
    assert_everywhere(world, failures)
    assert_everywhere(world, [] if all(option for _, option in committed) else [committed])
    assert len(set(map(str, world.allgather(committed)))) == 1, world.allgather(committed)
    comm.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("count", [2, 1000, 1 << 20])
def test_the_mpi_librarys_own_allreduce_gives_every_rank_bitwise_the_same_floats(comm, count):
    # What choosing native keeps (docs/algorithms.md): as with ringtree's algorithms, every rank
    # holds the same bits, though MPI may add in another order than they do.
    data = np.random.default_rng(comm.Get_rank()).standard_normal(count).astype(np.float32)
    result = np.empty_like(data)
    comm.Allreduce(data, result)
    assert_everywhere(comm, [] if same_on_all_ranks(comm, result) else ["ranks differ"])


def _where_native_is_fastest(monkeypatch, tmp_path) -> MPI.Comm:
    """A communicator with an empty tuning cache, whose trials find native 100 times faster than
    any algorithm."""
    monkeypatch.setenv("RINGTREE_CACHE_DIR", str(tmp_path))  # not what earlier tests committed
    settings.reload()
    comm = MPI.COMM_WORLD.Dup()
    comm_state(comm)
    monkeypatch.undo()
    settings.reload()
    honest = Tuner.record

    def native_fastest(trial, seconds):
        exploration, index = trial
        honest(trial, seconds * (1 if exploration.options[index].algorithm == NATIVE else 100))

    monkeypatch.setattr(Tuner, "record", staticmethod(native_fastest))
    return comm


@pytest.mark.mpi
def test_small_native_calls_go_through_persistent_requests_that_the_communicator_frees(monkeypatch, tmp_path):
    world = MPI.COMM_WORLD
    comm = _where_native_is_fastest(monkeypatch, tmp_path)
    rng = np.random.default_rng(world.Get_rank())
    failures = []
    counts = (2, 300, native.PERSISTENT_MAX // 8 + 1)  # the last one is too large: Iallreduce
    for count in counts:
        integers = rng.integers(-1000, 1000, count).astype(np.int64)
        floats = rng.standard_normal(count)
        expected = np.empty_like(integers)
        world.Allreduce(integers, expected)
        out, inplace = np.empty_like(integers), np.empty_like(integers)
        for call in range(60):  # the same arrays every call: the repeat path too
            ringtree.allreduce(integers, out, comm=comm)
            inplace[...] = integers
            ringtree.allreduce(MPI.IN_PLACE, inplace, comm=comm)
            if not (np.array_equal(out, expected) and np.array_equal(inplace, expected)):
                failures.append(f"count {count}, call {call}")
        summed = ringtree.allreduce(floats, comm=comm)
        if not same_on_all_ranks(world, summed) or not np.allclose(summed, world.allreduce(floats)):
            failures.append(f"count {count}: floats")
    tuner = comm_state(comm).tuner
    chosen = {tuner.committed.get(key_of(count * 8, in_place, 8, True)) for count in counts for in_place in (0, 1)}
    if chosen != {Option(NATIVE, 0)}:
        failures.append(f"committed {chosen}")
    state = comm_state(comm)
    persistent = [plan.native.request for plan in state.plans.values() if plan.native and plan.native.request]
    comm.Free()
    # One per small count and dtype, in place or not; freed, but where this rank, idle in a wait long
    # enough (ranks oversubscribed), told the others which call it was in: then it keeps them (state.free).
    if len(persistent) != 4 or (any(persistent) and not state.announced):
        failures.append(f"{len(persistent)} persistent requests, {sum(map(bool, persistent))} left after Free")
    assert_everywhere(world, failures)


@pytest.mark.mpi
def test_larger_calls_repeated_on_the_same_arrays_that_run_mpis_own_are_kept_bound_and_see_what_changed(
        monkeypatch, tmp_path):
    # Between AGAIN_MAX and NATIVE_AGAIN_MAX bytes only MPI's own blocking allreduce is kept bound to
    # its arrays (again.py): a repeat must still see a new dtype, a read-only array, new data.
    world = MPI.COMM_WORLD
    comm = _where_native_is_fastest(monkeypatch, tmp_path)
    rank, size = world.Get_rank(), world.Get_size()
    count = 2 * again.AGAIN_MAX // 8
    data, out = np.full(count, rank + 1, np.int64), np.empty(count, np.int64)
    failures = []
    for call in range(60):  # past the trials: then kept
        data[-1] = call
        ringtree.allreduce(data, out, comm=comm)
        if out[0] != size * (size + 1) // 2 or out[-1] != size * call:
            failures.append(f"call {call}: {out[[0, -1]]}")
            break
    if again.kept_runs(comm)["allreduce"].get(id(out)) is None:
        failures.append("not kept bound")
    out.dtype = np.float64
    with pytest.raises(TypeError, match=f"on rank {rank}.*dtype"):
        ringtree.allreduce(data, out, comm=comm)
    out.dtype = np.int64
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ringtree.allreduce(data, out, comm=comm)
    out.flags.writeable = True
    data[...] = rank
    ringtree.allreduce(data, out, comm=comm)
    if not (out == size * (size - 1) // 2).all():
        failures.append(f"after the refusals: {out[:3]}")
    comm.Free()
    assert_everywhere(world, failures)


@pytest.mark.mpi
def test_nonblocking_calls_run_mpis_own_allreduce_where_online_tuning_committed_to_it(monkeypatch, tmp_path):
    world = MPI.COMM_WORLD
    comm = _where_native_is_fastest(monkeypatch, tmp_path)
    rng = np.random.default_rng(world.Get_rank())
    failures, kinds = [], set()
    for count in (2, 3000):
        for call in range(60):
            data = rng.integers(-1000, 1000, count).astype(np.int64)
            expected = np.empty_like(data)
            world.Allreduce(data, expected)
            inplace = data.copy()
            requests = [ringtree.iallreduce(data, comm=comm), ringtree.iallreduce(MPI.IN_PLACE, inplace, comm=comm)]
            kinds.update(type(request.execution).__name__ for request in requests)
            while not requests[1].test():  # polled, then the other waited for: out of order
                pass
            if not (np.array_equal(requests[0].wait(), expected) and np.array_equal(inplace, expected)):
                failures.append(f"count {count}, call {call}")
    if "NativeInFlight" not in kinds:
        failures.append(f"requests of {kinds} only")
    comm.Free()
    assert_everywhere(world, failures)



@pytest.mark.mpi(min_size=2)
def test_a_rank_in_another_call_that_only_receives_meets_the_others_at_a_trials_barrier_and_all_raise(comm):
    # Rank 0's tree allreduce waits for its children; the others, in the first call of a new shape,
    # wait at the barrier that starts its trial and send nothing: only their word of which call
    # they wait in shows the difference.
    private = comm.Dup()
    failures = []
    try:
        if comm.Get_rank() == 0:
            ringtree.allreduce(np.ones(8), comm=private, algorithm="tree")
        else:
            ringtree.allreduce(np.arange(3000, dtype=np.uint16), comm=private)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if f"on rank {comm.Get_rank()}" not in str(error) or "count: 8 on rank 0" not in str(error):
            failures.append(str(error))
    assert_everywhere(comm, failures)


LEARNS = """
    import numpy as np
    from mpi4py import MPI
    import ringtree
    comm = MPI.COMM_WORLD
    for count in (2, 1000, 1 << 16):
        data = np.arange(count, dtype=np.float32) + comm.Get_rank()
        expected = np.empty_like(data)
        comm.Allreduce(data, expected)
        for call in range(60):  # enough to try every candidate
            assert np.array_equal(ringtree.allreduce(data), expected), (count, call)
"""


@pytest.mark.slow
@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 1, reason="starts its own mpiexec; run on one rank")
def test_a_second_job_starts_from_the_cache_with_no_trial_and_the_command_shows_and_clears_it(tmp_path):
    env = {"RINGTREE_CACHE_DIR": str(tmp_path), "RINGTREE_DEBUG": "1"}
    first = run_mpiexec(2, "-c", textwrap.dedent(LEARNS), env=env)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("committed to") == 3 and first.stderr.count("trials of") == 3, first.stderr
    [path] = list(tmp_path.glob("*.json"))
    assert len(json.loads(path.read_text())["choices"]) == 3

    second = run_mpiexec(2, "-c", textwrap.dedent(LEARNS), env=env)
    assert second.returncode == 0, second.stderr
    choices = [line for line in second.stderr.splitlines() if line.startswith("ringtree: allreduce")]
    assert len(choices) == 3 and all("from the tuning cache" in line for line in choices), second.stderr
    assert "trial" not in second.stderr and "committed" not in second.stderr
    # Native's persistent requests (tried in the first job, chosen or not) are freed before MPI ends.
    assert "persistent request" not in first.stderr + second.stderr, first.stderr

    for mode in ("off", "cache"):  # neither tries nor writes; off does not read the cache either
        empty = tmp_path / mode
        run = run_mpiexec(2, "-c", textwrap.dedent(LEARNS), env={**env, "RINGTREE_TUNE": mode,
                                                                  "RINGTREE_CACHE_DIR": str(empty)})
        assert run.returncode == 0, run.stderr
        assert "trial" not in run.stderr and not empty.exists(), run.stderr

    shown = run_mpiexec(1, "-m", "ringtree", "cache", env=env)
    assert shown.returncode == 0 and f"{path}: 2 ranks on" in shown.stdout, shown.stdout + shown.stderr
    assert "out of place, 4-byte elements, native allowed:" in shown.stdout
    cleared = run_mpiexec(1, "-m", "ringtree", "cache", "--clear", env=env)
    assert cleared.returncode == 0 and "deleted 1 tuning cache file" in cleared.stdout
    assert not path.exists()

