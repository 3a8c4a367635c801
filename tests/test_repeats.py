"""Calls that repeat: which way a loop's calls go (their run bound to the same arrays, again.kept_runs; what
a shape or an arrangement of arguments seen before shares, shapes.py; or the full path), on the arrays
programs bring, each result exactly MPI's own on the same inputs. A loop's way is compared with
another loop's in the same run, never with a time."""

import json

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere

pytestmark = pytest.mark.mpi

LOOP = 400  # calls: past online tuning's trials of a shape
COUNTED = 100  # the last calls of a loop, whose ways are counted


def _full_paths(monkeypatch) -> list:
    """A list that gets an item at each call of a public collective that goes the full path
    (call_path.run), not the run bound to its arrays."""
    from ringtree.api import allreduce as public_allreduce
    from ringtree.api import collectives as public

    entered: list = []
    for module in (public_allreduce, public):
        monkeypatch.setattr(module, "run", lambda *arguments, run=module.run: entered.append(1) or run(*arguments))
    return entered


_BLOCKS: dict = {}


def _block(array, count: int):
    """array[:count], one view per array: a loop passes the same view each call, as a program does."""
    key = (id(array), count)
    if key not in _BLOCKS:
        _BLOCKS[key] = array, array[:count]
    return _BLOCKS[key][1]


def _ours(name, data, out, op=MPI.SUM, **given):
    """ringtree's small call `name` (i...: started, then waited for) of data into out, root 0; a block of
    data.size / ranks elements to each rank where the call has blocks."""
    block = data.size // given.get("comm", MPI.COMM_WORLD).Get_size()
    started = name.startswith("i")
    call, name = getattr(ringtree, name), name[1:] if started else name
    if name == "allreduce":
        got = call(data, out, op, **given)
    elif name == "reduce_scatter":
        got = call(data, _block(out, block), None, op, **given)
    elif name == "allgather":
        got = call(_block(data, block), out, **given)
    elif name == "reduce":
        got = call(data, out, op, 0, **given)
    else:
        got = call(out, 0, **given)
    return got.wait() if started else got


def _mpi_s_own(name, comm, data, expected, op=MPI.SUM) -> None:
    """MPI's own call of _ours' `name` (blocking): `expected` gets its result."""
    name, block = name.removeprefix("i"), data.size // comm.Get_size()
    if name == "allreduce":
        comm.Allreduce(data, expected, op)
    elif name == "reduce_scatter":
        comm.Reduce_scatter_block(data, expected[:block], op)
    elif name == "allgather":
        comm.Allgather(data[:block], expected)
    elif name == "reduce":
        comm.Reduce(data, expected if comm.rank == 0 else None, op, root=0)
    else:
        comm.Bcast(expected, 0)


def _loop(world, name, data, out, turn: int, failures, label, op=MPI.SUM, **given):
    """A loop's call number `turn` of _ours with `op` (`given`: its keyword arguments), on data filled
    anew, its result compared with MPI's on `world`; what it returns."""
    rank, size = world.rank, world.size
    expected = np.empty_like(out)
    data[:] = np.arange(data.size) * (rank + 1) + turn
    out[:] = expected[:] = data[:out.size] if rank == 0 else 0
    _mpi_s_own(name, world, data, expected, op)
    got = _ours(name, data, out, op, **given)
    shown = slice(0, data.size // size) if name.endswith("reduce_scatter") else slice(None)
    if not np.array_equal(out[shown], expected[shown]):
        failures.append(f"{label}: {out[shown]} != {expected[shown]}")
    return got


def _looped(world, name, sets, entered, failures, label, **given) -> tuple[int, list]:
    """LOOP calls of _loop taking turns among `sets` of (data, out): how many of the last COUNTED went
    the full path (`entered`: _full_paths'), and what the calls returned."""
    full, results = 0, []
    for call in range(LOOP):
        data, out = sets[call % len(sets)]
        entered.clear()
        results.append(_loop(world, name, data, out, call, failures, f"{label}, call {call}", **given))
        full += len(entered) if call >= LOOP - COUNTED else 0
    return full, results


def _arrays(count: int, sets: int = 1):
    return [(np.empty(count, np.int64), np.empty(count, np.int64)) for _ in range(sets)]


SMALL = ["allreduce", "iallreduce", "reduce_scatter", "allgather", "broadcast", "reduce"]
ROOTED = ("broadcast", "reduce")


@pytest.mark.parametrize("name", SMALL)
def test_calls_that_leave_comm_out_repeat_as_fast_as_those_that_name_it(comm, name, monkeypatch):
    """comm left out means COMM_WORLD: a loop of small calls on the same arrays that leaves it out goes
    the full path no more often than the same calls naming COMM_WORLD, taken in turns with them."""
    entered, failures = _full_paths(monkeypatch), []
    [(data, out)] = _arrays(comm.size)
    full = {True: 0, False: 0}  # by whether the call left comm out
    for call in range(LOOP):
        left_out = call % 2 == 0
        entered.clear()
        _loop(comm, name, data, out, call, failures, f"call {call}", **({} if left_out else {"comm": comm}))
        full[left_out] += len(entered) if call >= LOOP - COUNTED else 0
    if full[True] > full[False]:
        failures.append(f"of the last {COUNTED // 2} calls each, {full[True]} leaving comm out went the full path, "
                        f"{full[False]} naming it")
    assert_everywhere(comm, failures[:3])


@pytest.mark.parametrize("name", SMALL)
def test_calls_taking_turns_among_three_sets_of_arrays_repeat_as_fast_as_calls_on_one(comm, name, monkeypatch):
    """A loop taking turns among three sets of arrays of one shape goes the full path no more often than
    a loop on one set: each set is bound to its arrays once it comes again (shapes.seen_before)."""
    entered, failures, local = _full_paths(monkeypatch), [], comm.Dup()
    sets, full = _arrays(comm.size, 3), {}
    for loop, turns in (("one set", sets[:1]), ("three sets in turn", sets)):
        full[loop] = _looped(comm, name, turns, entered, failures, loop, comm=local)[0]
    if full["three sets in turn"] > full["one set"]:
        failures.append(f"of the last {COUNTED} calls, {full} went the full path")
    assert_everywhere(comm, failures[:3])
    local.Free()


@pytest.mark.parametrize("name", ["allreduce", "iallreduce", "reduce_scatter", "allgather", "reduce"])
def test_calls_taking_turns_among_algorithms_and_ops_on_the_same_arrays_repeat_as_fast_as_calls_of_one(
        comm, name, monkeypatch):
    """A loop on the same arrays that takes turns among algorithms (auto and two of the collective's own)
    and, where the collective reduces, two ops, as a benchmark or a program of several reductions does,
    goes the full path no more often than a loop of one: each call's run is kept on the result array
    beside the others' (again._chain). A reduce takes turns among ops only: one of its own algorithms
    compares the ranks' roots before every call, which no run kept bound skips."""
    from ringtree.algorithms import GENERATORS

    entered, failures, local, full = _full_paths(monkeypatch), [], comm.Dup(), {}
    bare = name.removeprefix("i")
    ops = [MPI.SUM, MPI.MAX] if bare in ("allreduce", "reduce_scatter", "reduce") else [MPI.SUM]
    algorithms = ("auto",) if bare == "reduce" else ("auto", *list(GENERATORS[bare])[:2])
    turns = [(algorithm, op) for algorithm in algorithms for op in ops]
    [(data, out)] = _arrays(comm.size)
    for loop, taken in (("one", turns[:1]), ("in turns", turns)):
        full[loop] = 0
        for call in range(LOOP):
            algorithm, op = taken[call % len(taken)]
            entered.clear()
            _loop(comm, name, data, out, call, failures, f"{loop}, call {call}", op, comm=local, algorithm=algorithm)
            full[loop] += len(entered) if call >= LOOP - COUNTED else 0
    if full["in turns"] > full["one"]:
        failures.append(f"of the last {COUNTED} calls, {full} went the full path")
    assert_everywhere(comm, failures[:3])
    local.Free()


@pytest.mark.parametrize("name", SMALL)
def test_the_arrays_of_a_communicator_s_first_call_repeat_as_fast_as_those_of_a_later_call(comm, name, monkeypatch):
    """Nothing is bound to arrays before a communicator's first call is confirmed (again.may_keep); its
    arrays are bound once they come again, so a loop on them goes the full path no more often than a
    loop on arrays that a later call brings first."""
    entered, failures, local, full = _full_paths(monkeypatch), [], comm.Dup(), {}
    for loop, count in (("first", comm.size), ("later", 2 * comm.size)):  # another shape: a first call of its own
        full[loop] = _looped(comm, name, _arrays(count), entered, failures, loop, comm=local)[0]
    if full["first"] > full["later"]:
        failures.append(f"of the last {COUNTED} calls, {full} went the full path")
    assert_everywhere(comm, failures[:3])
    local.Free()


@pytest.mark.parametrize("name", ["iallreduce", "ireduce_scatter", "iallgather", "ibroadcast", "ireduce"])
def test_started_calls_on_a_communicator_with_no_blocking_call_repeat_as_fast_as_on_one_with(comm, name, monkeypatch):
    """A started call confirms nothing, so the wait for a communicator's first call to be confirmed does
    not hold back its runs: a loop of started calls on the same arrays goes the full path no more often
    on a communicator that has had no blocking call than on one that has."""
    entered, failures, full = _full_paths(monkeypatch), [], {}
    for loop in ("no blocking call", "a blocking call first"):
        local = comm.Dup()
        if loop == "a blocking call first":
            ringtree.allreduce(np.zeros(1), comm=local)
        full[loop] = _looped(comm, name, _arrays(comm.size), entered, failures, loop, comm=local)[0]
        local.Free()
    if full["no blocking call"] > full["a blocking call first"]:
        failures.append(f"of the last {COUNTED} calls, {full} went the full path")
    assert_everywhere(comm, failures[:3])


@pytest.mark.parametrize("started", [False, True], ids=["blocking", "started"])
def test_a_small_reduce_on_the_same_arrays_repeats_as_fast_as_a_broadcast(comm, started, monkeypatch):
    """A reduce's run is kept bound to its arrays as a broadcast's is, at the root and at the other ranks
    (whose recvbuf it does not look at, and which get None): a loop of small reduces on the same arrays
    goes the full path no more often than a loop of broadcasts of that size."""
    entered, failures, local, full = _full_paths(monkeypatch), [], comm.Dup(), {}
    for name in ("ibroadcast", "ireduce") if started else ("broadcast", "reduce"):
        full[name], got = _looped(comm, name, _arrays(comm.size), entered, failures, name, comm=local)
        if name.endswith("reduce") and comm.rank != 0 and any(result is not None for result in got):
            failures.append(f"{name} gave the other ranks than the root a result")
    if full["i" * started + "reduce"] > full["i" * started + "broadcast"]:
        failures.append(f"of the last {COUNTED} calls, {full} went the full path")
    assert_everywhere(comm, failures[:3])
    local.Free()


@pytest.mark.parametrize("name", ["reduce_scatter", "allgather", "reduce"])
def test_new_arrays_of_a_second_arrangement_of_a_shape_skip_the_checks_as_those_of_its_first_do(comm, name,
                                                                                                monkeypatch):
    """A shape's calls on new arrays with recvbuf given, then with a new result each call (another
    arrangement of the same shape, shapes.keep_shape): the second arrangement's calls go the full checks
    (collective_args.checked, as call_path calls it) no more often than the first's; every result MPI's own."""
    from ringtree.api import call_path

    rank, size = comm.rank, comm.size
    local, failures, checked, full = comm.Dup(), [], [], {}
    monkeypatch.setattr(call_path, "checked", lambda *arguments, checks=call_path.checked: checked.append(1)
                        or checks(*arguments))
    results = {"reduce_scatter": 2, "allgather": 2 * size * size, "reduce": 2 * size}
    for arrangement in ("recvbuf given", "new result"):
        full[arrangement] = 0
        for call in range(60):
            send = np.arange(2 * size, dtype=np.int64) * (rank + 1) + call
            given = None if arrangement == "new result" else np.empty(results[name], np.int64)
            checked.clear()
            got = getattr(ringtree, name)(send, given, comm=local)
            full[arrangement] += len(checked) if call >= 10 else 0
            everyone = comm.allgather(send)
            expected = (np.sum(everyone, axis=0)[2 * rank:2 * rank + 2] if name == "reduce_scatter" else
                        np.concatenate(everyone) if name == "allgather" else np.sum(everyone, axis=0) if rank == 0 else None)
            if (got is None) != (expected is None) or (got is not None and not np.array_equal(got.reshape(-1), expected)):
                failures.append(f"{arrangement}, call {call}: {got} != {expected}")
                break
    if full["new result"] > full["recvbuf given"]:
        failures.append(f"of the last 50 calls of each arrangement, {full} went the full checks")
    assert_everywhere(comm, failures)
    local.Free()


@pytest.mark.parametrize("name", ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"])
def test_a_call_on_arrays_of_a_seen_arrangement_that_fail_the_checks_is_refused_as_a_first_call_is(comm, name):
    """After calls on arrays of one arrangement (shapes.of_arrangement), a call on arrays of that dtype and
    shape that are not C-contiguous, read-only where written, or overlapping is refused as a first
    call is, on every rank, its arrays untouched; the next good call gives MPI's result."""
    rank, size = comm.rank, comm.size
    local, failures = comm.Dup(), []
    received = (2,) if name == "reduce_scatter" else (size, 2)

    def call(send, recv):
        if name in ("allreduce", "reduce_scatter"):
            return getattr(ringtree, name)(send, recv, comm=local)
        if name == "allgather":
            return ringtree.allgather(send[:1], recv, comm=local)
        if name == "broadcast":
            return ringtree.broadcast(recv, 0, comm=local)
        return ringtree.reduce(send, recv, root=0, comm=local)

    def arrays():
        return np.arange(2 * size, dtype=np.int64).reshape(size, 2) * (rank + 1), np.zeros(received, np.int64)

    for _ in range(3):
        call(*arrays())
    strided = np.zeros((size, 4), np.int64)[:, ::2]
    read_only = np.zeros(received, np.int64)
    read_only.flags.writeable = False
    shared = np.zeros(4 * size, np.int64)
    overlapping = shared[:2 * size].reshape(size, 2), shared[1:1 + int(np.prod(received))].reshape(received)
    send, recv = arrays()
    # cases every rank refuses: the other ranks of a reduce do not look at recvbuf, a broadcast's root
    # only reads its buffer
    bad = {"reduce": {"not C-contiguous": (strided, recv)},
           "broadcast": {"not C-contiguous": (send, strided)}}.get(name, {
        "not C-contiguous": (send, strided if name != "reduce_scatter" else np.zeros(4, np.int64)[::2]),
        "read-only": (send, read_only), "overlapping": overlapping})
    for what, (given, taken) in bad.items():
        before = taken.copy()
        try:
            call(given, taken)
            failures.append(f"{what}: not refused")
        except (TypeError, ValueError) as error:
            if f"on rank {rank}" not in str(error):
                failures.append(f"{what}: {error}")
        if not np.array_equal(taken, before):
            failures.append(f"{what}: the arrays were written")
    send, recv = arrays()
    got = call(send, recv)
    expected = {"allreduce": lambda: comm.allreduce(send), "broadcast": lambda: np.zeros(received, np.int64),
                "reduce": lambda: comm.reduce(send, root=0), "allgather": lambda: np.array(comm.allgather(send[:1])),
                "reduce_scatter": lambda: comm.allreduce(send)[rank]}[name]()
    if got is not None and not np.array_equal(np.asarray(got).reshape(-1), np.asarray(expected).reshape(-1)):
        failures.append(f"after the refusals: {got} != {expected}")
    assert_everywhere(comm, failures)
    local.Free()


def test_calls_on_distinct_arrays_after_one_on_two_views_of_one_memory_give_mpi_s_result(comm):
    """A first allreduce whose send and receive arrays are two views of one memory runs in place; the
    calls after it on distinct arrays of the same dtype and shape must not (shapes.arrangement_of). An
    algorithm named: no online tuning's trials, whose calls keep no shape."""
    local, failures = comm.Dup(), []
    memory = np.arange(6, dtype=np.int64) * (comm.rank + 1)
    ringtree.allreduce(memory[:], memory[:], comm=local, algorithm="ring")
    for turn in range(4):
        send, recv, expected = np.arange(6, dtype=np.int64) * (comm.rank + 1) + turn, np.zeros(6, np.int64), np.empty(6, np.int64)
        comm.Allreduce(send, expected)
        ringtree.allreduce(send, recv, comm=local, algorithm="ring")
        if not np.array_equal(recv, expected):
            failures.append(f"turn {turn}: {recv} != {expected}")
    assert_everywhere(comm, failures)
    local.Free()


def _new_result_call(name, send, root=0, started=False, **given):
    """ringtree's call `name` into a new result (a broadcast: on `send`, a new buffer), with MPI's own
    result on the same inputs: (ours, MPI's); `started`: its i-function's, waited for."""
    comm = given["comm"]
    size, rank = comm.size, comm.rank
    if name == "broadcast":
        expected = send.copy()
        comm.Bcast(expected, root)
        return ringtree.broadcast(send, root, **given), expected.reshape(-1)
    flat = np.ascontiguousarray(send).reshape(-1)
    if name == "allreduce":
        expected = np.empty_like(flat)
        comm.Allreduce(flat, expected)
    elif name == "reduce_scatter":
        expected = np.empty(flat.size // size, flat.dtype)
        comm.Reduce_scatter_block(flat, expected)
    elif name == "allgather":
        expected = np.empty(flat.size * size, flat.dtype)
        comm.Allgather(flat, expected)
    elif name == "reduce":
        expected = np.empty_like(flat) if rank == root else None
        comm.Reduce(flat, expected, root=root)
    else:
        expected = np.empty_like(flat)
        comm.Alltoall(flat, expected)
    call = getattr(ringtree, "i" + name if started else name)
    ours = call(send, root=root, **given) if name == "reduce" else call(send, **given)
    return (ours.wait() if started else ours), expected


@pytest.fixture(params=["native", "schedule"], ids=["MPI's own", "a schedule"])
def one_way_everywhere(request, comm, tmp_path, monkeypatch):
    """A tuning table (RINGTREE_TUNING_FILE) whose rules take one way for every collective at every size:
    MPI's own, or the first of ringtree's algorithms of each (a small call of which runs a step at a
    time), in force for the communicators set up until the test ends."""
    from ringtree import settings
    from ringtree.algorithms import REGISTRY
    from ringtree.tuning import selector

    def rule(name):
        algorithm = "native" if request.param == "native" else next(iter(REGISTRY[name]))
        return {"bytes": [0, None], "algorithm": algorithm, "segment": 0}

    table = {"format": selector.FORMAT, "note": f"{request.param} everywhere",
             "rules": [{**rule("allreduce"), "ranks": [1, 1024], "without_native": {"algorithm": "ring", "segment": 0}}],
             "collectives": {name: {str(comm.size): {"rules": [rule(name)], "without_native": [
                 {"bytes": [0, None], "algorithm": next(iter(algorithms)), "segment": 0}]}}
                 for name, algorithms in REGISTRY.items() if name != "allreduce"}}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv("RINGTREE_TUNING_FILE", str(path))
    settings.reload()
    selector.use_table(None)
    yield request.param
    monkeypatch.delenv("RINGTREE_TUNING_FILE")
    settings.reload()
    selector.use_table(None)


@pytest.mark.parametrize("name", ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"])
def test_calls_on_new_arrays_each_take_their_shape_s_run_for_every_collective_with_mpi_s_result(
        comm, name, monkeypatch, one_way_everywhere):
    """A loop of small calls into a new result each call (a broadcast: on a new buffer each call) that run
    MPI's own or a step at a time: after the first calls none goes the full path (again._NewResult,
    kept by the shape), but a rooted call of a schedule, which compares its arguments each call;
    every result exactly MPI's; then calls that differ from the shape's (dtype, shape, a strided view,
    a read-only input, another root) give MPI's result too, and a strided one is refused as a first call is."""
    entered, failures = _full_paths(monkeypatch), []
    local = comm.Dup()
    rank, size = comm.rank, comm.size
    full = 0
    for call in range(60):
        send = np.arange(2 * size, dtype=np.int64) * (rank + 1) + call
        entered.clear()
        got, expected = _new_result_call(name, send, comm=local)
        full += len(entered) if call >= 10 else 0
        if (got is None) != (expected is None) or (got is not None and not np.array_equal(got.reshape(-1), expected)):
            failures.append(f"call {call}: {got} != {expected}")
            break
    if full and not (name in ROOTED and one_way_everywhere == "schedule"):
        failures.append(f"{full} of the last 50 calls went the full path")
    read_only = np.arange(2 * size, dtype=np.int64) + rank
    read_only.flags.writeable = False
    others = {"int32": np.arange(2 * size, dtype=np.int32) + rank, "2-D": np.arange(2 * size).reshape(size, 2) + rank,
              "root 1": np.arange(2 * size) * (rank + 3)}
    if name != "broadcast":  # a broadcast's buffer is written at the ranks but its root
        others["read-only"] = read_only
    for what, send in others.items():
        got, expected = _new_result_call(name, send, root=1 % size if what == "root 1" else 0, comm=local)
        if (got is None) != (expected is None) or (got is not None and (
                not np.array_equal(got.reshape(-1), expected) or got.dtype != send.dtype)):
            failures.append(f"{what}: {got} != {expected}")
    with pytest.raises(ValueError, match=f"on rank {rank}: .* not contiguous"):
        _new_result_call(name, (np.arange(4 * size) + rank)[::2], comm=local)
    assert_everywhere(comm, failures)
    local.Free()


@pytest.mark.parametrize("name", ["allreduce", "reduce_scatter", "allgather", "reduce", "alltoall"])
def test_started_calls_into_a_new_result_each_take_their_shape_s_start_with_mpi_s_result(
        comm, name, monkeypatch, one_way_everywhere):
    """A loop of small started calls into a new result each call, each waited for: after the first calls
    none goes the full path (again._NewResult, kept by the shape under the i-function), but a reduce,
    whose roots are compared at each call (a schedule's arguments, or MPI's own marks beside the data,
    which that start lacks); every result exactly MPI's; then ranks that name different roots for a
    reduce all raise MismatchError."""
    entered, failures = _full_paths(monkeypatch), []
    local, size, full = comm.Dup(), comm.size, 0
    for call in range(60):
        send = np.arange(2 * size, dtype=np.int64) * (comm.rank + 1) + call
        entered.clear()
        got, expected = _new_result_call(name, send, started=True, comm=local)
        full += len(entered) if call >= 10 else 0
        if (got is None) != (expected is None) or (got is not None and not np.array_equal(got.reshape(-1), expected)):
            failures.append(f"call {call}: {got} != {expected}")
            break
    if full and name not in ROOTED:
        failures.append(f"{full} of the last 50 calls went the full path")
    if name == "reduce" and size > 1:  # ranks that name different roots all raise, as at a first call
        with pytest.raises(ringtree.MismatchError, match=f"on rank {comm.rank}"):
            ringtree.ireduce(np.arange(2 * size, dtype=np.int64), root=comm.rank % 2, comm=local).wait()
    assert_everywhere(comm, failures)
    local.Free()


def _past_kept_runs(monkeypatch) -> list:
    """A list that gets an item at each call that goes past the runs kept for it (call_path._called)."""
    from ringtree.api import call_path

    entered: list = []
    monkeypatch.setattr(call_path, "_called", lambda *arguments, called=call_path._called: entered.append(1)
                        or called(*arguments))
    return entered


def _into_given_call(name, send, recv, comm, root=0):
    """ringtree's call `name` of `send` into `recv`, with MPI's own result on the same inputs: (ours, MPI's);
    a reduce's other ranks than the root get None from ringtree, and MPI's result None."""
    expected = np.empty_like(recv)
    if name == "allreduce":
        comm.Allreduce(send, expected)
    elif name == "reduce_scatter":
        comm.Reduce_scatter_block(send, expected)
    elif name == "allgather":
        comm.Allgather(send, expected)
    elif name == "reduce":
        comm.Reduce(send, expected, root=root)
        expected = expected if comm.rank == root else None
    else:
        comm.Alltoall(send, expected)
    return _into(name, send, recv, comm, root), expected


def _into(name, send, recv, comm, root=0):
    call = getattr(ringtree, name)
    return call(send, recv, root=root, comm=comm) if name == "reduce" else call(send, recv, comm=comm)


@pytest.mark.parametrize("name", ["allreduce", "reduce_scatter", "allgather", "reduce", "alltoall"])
def test_calls_on_new_arrays_into_a_new_result_given_take_their_shape_s_run_with_mpi_s_result(
        comm, name, monkeypatch, one_way_everywhere):
    """A loop of small calls of a new input into a result array given but new each call, that run MPI's
    own or a step at a time: after the first calls none goes past the shape's kept run
    (again._NewResult.ran_into), but a rooted call of a schedule, which compares its arguments each
    call; every result exactly MPI's; then a result of another dtype or shape, a read-only one, and one that
    overlaps the input are refused as a first call's are."""
    entered, failures = _past_kept_runs(monkeypatch), []
    local = comm.Dup()
    rank, size = comm.rank, comm.size
    sizes = {"reduce_scatter": 2, "allgather": 2 * size * size}  # the result's elements, of 2 * size sent
    for call in range(20):  # calls of the shape into a new result first: the ways of the two must not mix
        _new_result_call(name, np.arange(2 * size, dtype=np.int64) + call, comm=local)
    full = 0
    for call in range(60):
        send = np.arange(2 * size, dtype=np.int64) * (rank + 1) + call
        recv = np.empty(sizes.get(name, 2 * size), np.int64)
        entered.clear()
        got, expected = _into_given_call(name, send, recv, local)
        full += len(entered) if call >= 10 else 0
        if (got is None) != (expected is None) or (got is not None and (got is not recv or
                                                                        not np.array_equal(got, expected))):
            failures.append(f"call {call}: {got} != {expected}")
            break
    if full and not (name in ROOTED and one_way_everywhere == "schedule"):
        failures.append(f"{full} of the last 50 calls went past the kept run")
    send = np.arange(2 * size, dtype=np.int64) + rank
    read_only = np.empty(sizes.get(name, 2 * size), np.int64)
    read_only.flags.writeable = False
    refused = {"another dtype": np.empty(read_only.size, np.int32), "read-only": read_only}
    for recv in refused.values():  # a reduce's other ranks, whose recvbuf is not looked at, learn of the root's refusal
        with pytest.raises((TypeError, ValueError, ringtree.MismatchError), match=f"on rank {rank}"):
            _into(name, send, recv, local)
    if name in ("allreduce", "alltoall"):
        whole = np.arange(4 * size, dtype=np.int64) + rank
        with pytest.raises(ValueError, match=f"on rank {rank}: .*overlap"):
            _into(name, whole[:2 * size], whole[size:3 * size], local)
    assert_everywhere(comm, failures)
    local.Free()


@pytest.mark.parametrize("name", ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"])
def test_calls_on_new_arrays_with_a_collective_in_flight_let_it_progress_with_mpi_s_result(
        comm, name, one_way_everywhere):
    """Calls into a new result each call whose shape's run is kept (again._NewResult), made while an
    iallreduce is in flight, by one rank before it waits for it and by the others after: none waits
    for the other's call without moving the collective in flight (a run a step at a time would take
    its messages, or leave the ranks waiting on each other), and every result is MPI's own."""
    local, failures = comm.Dup(), []
    rank, size = comm.rank, comm.size
    for call in range(20):
        _new_result_call(name, np.arange(2 * size, dtype=np.int64) + call, comm=local)
    send = np.arange(2 * size, dtype=np.int64) * (rank + 1)
    _, expected = _new_result_call(name, send.copy(), comm=local)  # MPI's own, before anything is in flight
    call = getattr(ringtree, name)
    request = ringtree.iallreduce(np.full(1 << 18, rank, np.int64), comm=local, algorithm="ring", segment=1 << 14)
    if rank == 0:
        got = call(send.copy(), comm=local)
        total = request.wait()
    else:
        total = request.wait()
        got = call(send.copy(), comm=local)
    if not (total == size * (size - 1) // 2).all():
        failures.append("the iallreduce in flight went wrong")
    if (got is None) != (expected is None) or (got is not None and not np.array_equal(got.reshape(-1), expected)):
        failures.append(f"{got} != {expected}")
    assert_everywhere(comm, failures)
    local.Free()
