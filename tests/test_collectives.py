"""reduce_scatter, allgather, broadcast and reduce against MPI's own on the same inputs, exactly: every
algorithm x every dtype and op; counts 0, 1, N±1, primes, more than a segment, uneven blocks with zeros;
every root; in place where MPI allows; blocking, nonblocking and persistent; every kind of buffer the
allreduce takes, through ringtree.Communicator; and bad input, refused before any message."""

import array

import numpy as np
import pytest
from mpi4py import MPI
from test_mpi4py_buffers import DLPackOnly

import ringtree
from conftest import assert_everywhere, same_on_all_ranks
from ringtree.algorithms import GENERATORS
from ringtree.api import persistent
from ringtree.ops import ReduceOp, check_dtype, parse_op
from ringtree.runtime.engine.native import reduces
from ringtree.runtime.session.state import comm_state
from ringtree.runtime.transports.backend import NumpyBackend

pytestmark = pytest.mark.mpi

ALGORITHMS = {name: ["auto", *sorted(GENERATORS[name])] for name in ("reduce_scatter", "allgather", "broadcast",
                                                                      "reduce", "alltoall")}
TYPECODES = "?bBhHiIlLqQefdgFDG"
OPS = [MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN, MPI.LAND, MPI.LOR, MPI.LXOR, MPI.BAND, MPI.BOR, MPI.BXOR, "avg"]
SEGMENT = 64  # bytes: a call of more than 8 float64 is pipelined


def _ops_for(dtype):
    found = []
    for op in OPS:
        try:
            check_dtype(dtype, parse_op(op))
        except TypeError:
            continue
        found.append(op)
    return found


def _values(count, dtype, rank, op=None):
    """Small integers (a PROD of ones and twos), so that every order of the reduction gives the same."""
    rng = np.random.default_rng(1000 * rank + count)
    if op is MPI.PROD:
        values = 1 + (rng.random(count) < 0.1)
    elif dtype.kind == "b":
        values = rng.random(count) < 0.5
    else:
        values = rng.integers(0 if dtype.kind == "u" else -4, 5, count)
    return np.asarray(values).astype(dtype)


def _everyone(comm, array_):
    return np.array(comm.allgather(array_)).reshape(comm.size, -1)


def _reduced(comm, x, op):
    """The total of every rank's x with op, by MPI where it reduces the dtype, else by numpy."""
    reduce_op = parse_op(op)
    if reduces(x.dtype, reduce_op):
        total = np.empty_like(x)
        comm.Allreduce(x, total, ringtree.ops.MPI_OP[reduce_op])
    else:  # float16, and avg's sum: numpy over every rank's input, in rank order
        total = _everyone(comm, x)[0].copy()
        for other in _everyone(comm, x)[1:]:
            total = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
                     ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[reduce_op](total, other).astype(x.dtype)
    if reduce_op is ReduceOp.AVG:
        NumpyBackend.divide(total, comm.size)
    return total


def _blocks(comm, per_rank):
    starts = np.concatenate([[0], np.cumsum(per_rank)])
    return [slice(starts[r], starts[r + 1]) for r in range(comm.size)]


@pytest.mark.parametrize("algorithm", ALGORITHMS["reduce_scatter"])
def test_reduce_scatter_of_every_dtype_and_op(comm, algorithm):
    counts = [comm.size + 1] * comm.size
    for typecode in TYPECODES:
        dtype = np.dtype(typecode)
        for op in _ops_for(dtype):
            x = _values(sum(counts), dtype, comm.rank, op)
            got = ringtree.reduce_scatter(x, counts=counts, op=op, comm=comm, algorithm=algorithm)
            assert np.array_equal(got, _reduced(comm, x, op)[_blocks(comm, counts)[comm.rank]]), (typecode, op)


@pytest.mark.parametrize("algorithm", ALGORITHMS["reduce"])
def test_reduce_of_every_dtype_and_op(comm, algorithm):
    root = comm.size - 1
    for typecode in TYPECODES:
        dtype = np.dtype(typecode)
        for op in _ops_for(dtype):
            x = _values(comm.size + 1, dtype, comm.rank, op)
            expected = _reduced(comm, x, op)
            got = ringtree.reduce(x, op=op, root=root, comm=comm, algorithm=algorithm)
            assert (got is None) == (comm.rank != root)
            assert comm.rank != root or np.array_equal(got, expected), (typecode, op)


@pytest.mark.parametrize("algorithm", ALGORITHMS["allgather"])
def test_allgather_of_every_dtype(comm, algorithm):
    for typecode in TYPECODES:
        x = _values(comm.size + 1, np.dtype(typecode), comm.rank)
        got = ringtree.allgather(x, comm=comm, algorithm=algorithm)
        assert np.array_equal(got, _everyone(comm, x)), typecode
        assert same_on_all_ranks(comm, got)


@pytest.mark.parametrize("algorithm", ALGORITHMS["broadcast"])
def test_broadcast_of_every_dtype(comm, algorithm):
    for typecode in TYPECODES:
        x = _values(comm.size + 1, np.dtype(typecode), 0)
        buf = x.copy() if comm.rank == 0 else np.zeros_like(x)
        assert ringtree.broadcast(buf, comm=comm, algorithm=algorithm) is buf
        assert np.array_equal(buf, x), typecode


def _sizes(comm):
    """Counts per rank: 0, 1, N-1, N+1, primes, more than a segment."""
    return sorted({0, 1, comm.size - 1, comm.size + 1, 13, 97})


def _uneven(comm):
    return [(0, 1, 5, 0, 17, 2, 3, 11)[r % 8] for r in range(comm.size)]


def failures_on(comm, name, algorithm, segment, made, host) -> list[str]:
    """`name` run with `algorithm` on arrays that `made(numpy array)` gives (numpy's, CuPy's:
    test_gpu.py), against MPI's own on the numpy arrays: int64 and float32, equal and uneven
    blocks with zeros, every root; what differed, as text. `host(result)` is a result as numpy's."""
    n, rank = comm.size, comm.rank
    options = dict(comm=comm, algorithm=algorithm, segment=segment)
    failures = []
    for counts, dtype in [(c, np.dtype(t)) for c in ([3] * n, _uneven(comm)) for t in ("int64", "float32")]:
        x = ((np.arange(sum(counts)) + 7 * rank) % 11 - 5).astype(dtype)
        if name == "reduce_scatter":
            expected = np.empty(counts[rank], dtype)
            comm.Reduce_scatter(x, expected, counts)
            cases = [(ringtree.reduce_scatter(made(x), counts=counts, **options), expected)]
        elif name == "allgather":
            expected = np.empty(sum(counts), dtype)
            comm.Allgatherv(x[:counts[rank]].copy(), [expected, counts])
            cases = [(ringtree.allgather(made(x[:counts[rank]].copy()), counts=counts, **options), expected)]
        elif name == "broadcast":
            cases = []
            for root in range(n):
                expected = x.copy()
                comm.Bcast(expected, root)
                cases.append((ringtree.broadcast(made(x), root, **options), expected))
        elif name == "alltoall":  # blocks alike: counts[0] elements each
            every = ((np.arange(n * counts[0]) + 7 * rank) % 11 - 5).astype(dtype)
            expected = np.empty_like(every)
            comm.Alltoall(every, expected)
            cases = [(ringtree.alltoall(made(every), **options), expected)]
        else:
            cases = []
            for root in range(n):
                expected = np.empty_like(x)
                comm.Reduce(x, expected, MPI.SUM, root)
                cases.append((ringtree.reduce(made(x), root=root, **options), expected if rank == root else None))
        for got, expected in cases:
            what = f"{name} {algorithm} segment {segment}, blocks {counts}, {dtype}"
            if expected is None:
                if got is not None:
                    failures.append(f"{what}: a rank other than the root got {type(got).__name__}")
            elif type(got) is not type(made(x[:0])):
                failures.append(f"{what}: the result is {type(got).__name__}")
            elif host(got).dtype != dtype or not np.array_equal(host(got), expected):
                failures.append(f"{what}: the result differs from MPI's")
    return failures


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_collective_s_auto_gives_mpi_s_result_for_every_root_and_blocks(comm, name):
    assert_everywhere(comm, failures_on(comm, name, "auto", None, np.array, np.asarray))


@pytest.mark.parametrize("name", [*ALGORITHMS, "allreduce"])
def test_native_runs_mpi_s_own_through_ringtree_s_path_and_gives_mpi_s_result(comm, name):
    local = comm.Dup()  # a session of its own: its plans are this test's
    if name == "allreduce":
        x, expected = np.arange(10, dtype=np.int64) * (comm.rank + 1), np.empty(10, np.int64)
        comm.Allreduce(x, expected)
        got = [ringtree.allreduce(x, algorithm="native", comm=local),
               ringtree.iallreduce(x, algorithm="native", comm=local).wait()]
        failures = [f"allreduce native: {result} != {expected}" for result in got if not np.array_equal(result, expected)]
    else:
        failures = failures_on(local, name, "native", None, np.array, np.asarray)
    plans = [plan for key, plan in comm_state(local).plans.items() if key[2] == "native"]  # by the algorithm named
    if not plans or any(plan.native is None for plan in plans):
        failures.append(f"{name} native: {len(plans)} plans, of which MPI's own {[p.native is not None for p in plans]}")
    local.Free()
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("algorithm", ALGORITHMS["reduce_scatter"])
@pytest.mark.parametrize("segment", [None, SEGMENT])
def test_reduce_scatter_of_every_count_in_place_and_not(comm, algorithm, segment):
    for counts in [[n] * comm.size for n in _sizes(comm)] + [_uneven(comm)]:
        x = _values(sum(counts), np.dtype(np.int64), comm.rank)
        expected = np.empty(counts[comm.rank], np.int64)
        comm.Reduce_scatter(x, expected, counts)
        options = dict(comm=comm, algorithm=algorithm, segment=segment)
        assert np.array_equal(ringtree.reduce_scatter(x, counts=counts, **options), expected)
        assert np.array_equal(ringtree.ireduce_scatter(x, counts=counts, **options).wait(), expected)
        inplace = x.copy()
        assert ringtree.reduce_scatter(MPI.IN_PLACE, inplace, counts, **options) is inplace
        assert np.array_equal(inplace[:counts[comm.rank]], expected), counts
        assert np.array_equal(inplace[counts[comm.rank]:], x[counts[comm.rank]:])  # the rest as it was


@pytest.mark.parametrize("algorithm", ALGORITHMS["allgather"])
@pytest.mark.parametrize("segment", [None, SEGMENT])
def test_allgather_of_every_count_in_place_and_not(comm, algorithm, segment):
    for counts in [[n] * comm.size for n in _sizes(comm)] + [_uneven(comm)]:
        mine = _values(counts[comm.rank], np.dtype(np.float64), comm.rank)
        expected = np.empty(sum(counts))
        comm.Allgatherv(mine, [expected, counts])
        options = dict(comm=comm, algorithm=algorithm, segment=segment)
        assert np.array_equal(ringtree.allgather(mine, counts=counts, **options), expected)
        assert np.array_equal(ringtree.iallgather(mine, None, counts, **options).wait(), expected)
        inplace = np.full(sum(counts), np.nan)
        inplace[_blocks(comm, counts)[comm.rank]] = mine
        assert np.array_equal(ringtree.allgather(MPI.IN_PLACE, inplace, counts, **options), expected), counts
        assert same_on_all_ranks(comm, inplace)


@pytest.mark.parametrize("algorithm", ALGORITHMS["broadcast"])
@pytest.mark.parametrize("segment", [None, SEGMENT])
def test_broadcast_from_every_root_of_every_count(comm, algorithm, segment):
    for root in range(comm.size):
        for count in _sizes(comm):
            x = _values(count, np.dtype(np.float32), root)
            expected = x.copy() if comm.rank == root else np.zeros_like(x)
            comm.Bcast(expected, root)
            options = dict(comm=comm, algorithm=algorithm, segment=segment)
            buf = x.copy() if comm.rank == root else np.zeros_like(x)
            ringtree.broadcast(buf, root, **options)
            assert np.array_equal(buf, expected), (root, count)
            buf = x.copy() if comm.rank == root else np.zeros_like(x)
            assert ringtree.ibroadcast(buf, root, **options).wait() is buf
            assert np.array_equal(buf, expected)


@pytest.mark.parametrize("algorithm", ALGORITHMS["reduce"])
@pytest.mark.parametrize("segment", [None, SEGMENT])
def test_reduce_to_every_root_of_every_count_in_place_and_not(comm, algorithm, segment):
    for root in range(comm.size):
        for count in _sizes(comm):
            x = _values(count, np.dtype(np.int32), comm.rank)
            expected = np.empty_like(x) if comm.rank == root else None
            comm.Reduce(x, expected, MPI.SUM, root)
            options = dict(comm=comm, algorithm=algorithm, segment=segment)
            got = ringtree.reduce(x, None, MPI.SUM, root, **options)
            assert (got is None if comm.rank != root else np.array_equal(got, expected)), (root, count)
            got = ringtree.ireduce(x, None, MPI.SUM, root, **options).wait()
            assert comm.rank != root or np.array_equal(got, expected)
            inplace = x.copy()
            ringtree.reduce(MPI.IN_PLACE if comm.rank == root else inplace, inplace, MPI.SUM, root, **options)
            assert np.array_equal(inplace, expected if comm.rank == root else x)


def _kinds(typecode):
    """(kind, make a buffer of it from a numpy array of values), as test_mpi4py_buffers makes them."""
    return [
        ("numpy", lambda a: a),
        ("numpy, Fortran order", lambda a: np.asfortranarray(a.reshape(-1, 2))),
        ("buffer protocol only", memoryview),
        ("DLPack only", DLPackOnly),
        ("array.array", lambda a: array.array(typecode, a.tolist())),
        ("[buf, datatype]", lambda a: [a, MPI.Datatype.fromcode(typecode)]),
    ]


def _held(buf, dtype):
    if isinstance(buf, list):
        buf = buf[0]
    if isinstance(buf, DLPackOnly):
        buf = buf._array
    return np.asarray(buf).ravel(order="K").view(dtype)


@pytest.mark.parametrize("typecode", "id")
def test_every_kind_of_buffer_through_the_communicator(comm, typecode):
    """Each method against MPI's own of the same name, on the same inputs."""
    rt, dtype, n = ringtree.Communicator(comm), np.dtype(typecode), comm.size
    block = 4  # elements per rank: an even number, for the Fortran-ordered kind
    for kind, make in _kinds(typecode):
        sent = make(_values(block * n, dtype, comm.rank))
        x = _held(sent, dtype).copy()  # what MPI reads: the values in memory order
        ours, theirs = make(np.zeros(block, dtype)), np.zeros(block, dtype)
        rt.Reduce_scatter_block(sent, ours)
        comm.Reduce_scatter_block(x, theirs)
        assert np.array_equal(_held(ours, dtype), theirs), kind
        ours, theirs = make(np.zeros(block * n, dtype)), np.zeros(block * n, dtype)
        rt.Allgather(make(x[:block].copy()), ours)
        comm.Allgather(_held(make(x[:block].copy()), dtype).copy(), theirs)
        assert np.array_equal(_held(ours, dtype), theirs), kind
        ours = make(x.copy() if comm.rank == 0 else np.zeros_like(x))
        theirs = _held(ours, dtype).copy()
        rt.Bcast(ours, 0)
        comm.Bcast(theirs, 0)
        assert np.array_equal(_held(ours, dtype), theirs), kind
        ours, theirs = make(np.zeros_like(x)), np.zeros_like(x)
        rt.Reduce(sent, ours, MPI.SUM, 0)
        comm.Reduce(x, theirs, MPI.SUM, 0)
        assert comm.rank != 0 or np.array_equal(_held(ours, dtype), theirs), kind


def test_the_communicator_s_nonblocking_and_persistent_forms(comm):
    rt, n = ringtree.Communicator(comm), comm.size
    counts = _uneven(comm)
    x = _values(sum(counts), np.dtype(np.int64), comm.rank)
    expected = np.empty(counts[comm.rank], np.int64)
    comm.Reduce_scatter(x, expected, counts)
    got = np.zeros_like(expected)
    MPI.Request.Waitall([rt.Ireduce_scatter(x, got, counts)])
    assert np.array_equal(got, expected)
    gathered, theirs = np.zeros(sum(counts), np.int64), np.zeros(sum(counts), np.int64)
    comm.Allgatherv(x[:counts[comm.rank]], [theirs, counts])
    persistent = rt.Allgatherv_init(x[:counts[comm.rank]], [gathered, counts])
    buf = np.zeros(5)
    broadcasts = rt.Bcast_init(buf, n - 1)
    for round_ in range(3):
        gathered[:] = -1
        persistent.Start()
        buf[:] = round_ if comm.rank == n - 1 else -1
        broadcasts.Start()
        persistent.Wait()
        broadcasts.Wait()
        assert np.array_equal(gathered, theirs) and np.array_equal(buf, np.full(5, round_))
    persistent.Free()
    broadcasts.Free()


def test_what_ringtree_does_not_compute_goes_to_mpi_s_own(comm):
    rt = ringtree.Communicator(comm)
    pairs = np.dtype([("v", "f8"), ("i", "i4")], align=True)
    mine = np.array([(float(comm.rank % 2), comm.rank)], pairs)
    ours = np.zeros(1, pairs)
    rt.Reduce([mine, MPI.DOUBLE_INT], [ours, MPI.DOUBLE_INT], MPI.MAXLOC, 0)
    assert comm.rank != 0 or tuple(ours[0]) == (float(comm.size > 1), 1 if comm.size > 1 else 0)
    # Displacements with a gap: MPI's own lays the blocks out
    gathered = np.full(3 * comm.size, -1.0)
    rt.Allgatherv(np.full(2, float(comm.rank)), [gathered, ([2] * comm.size, list(range(0, 3 * comm.size, 3))), MPI.DOUBLE])
    assert np.array_equal(gathered.reshape(-1, 3)[:, :2], np.repeat(np.arange(comm.size), 2).reshape(-1, 2))


def _read_only(count):
    array = np.zeros(count)
    array.setflags(write=False)
    return array


BAD = [
    ("a root out of range", lambda comm, x: ringtree.broadcast(x, comm.size, comm=comm), ValueError,
     "ringtree broadcast on rank {rank}: root {size} is not a rank"),
    ("counts that do not add up", lambda comm, x: ringtree.reduce_scatter(x, counts=[1] * comm.size, comm=comm),
     ValueError, r"ringtree reduce_scatter on rank {rank}: counts add up to {size} but sendbuf has 64 elements"),
    ("blocks that do not divide", lambda comm, x: ringtree.reduce_scatter(x[:comm.size + 1], comm=comm) if comm.size > 1
     else ringtree.reduce_scatter(x, counts=[2], comm=comm), ValueError, "ringtree reduce_scatter on rank {rank}:"),
    ("a recvbuf too small", lambda comm, x: ringtree.allgather(x, np.zeros(comm.size * 64 - 1), comm=comm),
     ValueError, r"recvbuf has \d+ elements, too few for every rank's block"),
    ("a read-only recvbuf", lambda comm, x: ringtree.reduce(x, _read_only(64), comm=comm) if comm.rank == 0
     else ringtree.reduce(x, root=-1, comm=comm), ValueError, "ringtree reduce on rank {rank}: (recvbuf is read-only|root)"),
    ("IN_PLACE at a rank other than the root", lambda comm, x: ringtree.reduce(MPI.IN_PLACE, x, root=1, comm=comm)
     if comm.rank != 1 % comm.size else ringtree.reduce(MPI.IN_PLACE, x, root=comm.size + 1, comm=comm), ValueError,
     "ringtree reduce on rank {rank}:"),
    ("an op on a dtype it is not defined on", lambda comm, x: ringtree.reduce_scatter(
        x.astype(np.float32), counts=[64] + [0] * (comm.size - 1), op=MPI.BAND, comm=comm), TypeError,
     "op band is not defined for dtype float32"),
    ("an unknown algorithm", lambda comm, x: ringtree.allgather(x, comm=comm, algorithm="ring_of_fire"), ValueError,
     "unknown allgather algorithm 'ring_of_fire'"),
]


@pytest.mark.parametrize("what,call,error,message", BAD, ids=[case[0] for case in BAD])
def test_bad_input_is_refused_before_any_message_and_buffers_are_left_alone(comm, what, call, error, message):
    x = np.arange(64, dtype=np.float64)
    with pytest.raises(error, match=message.format(rank=comm.rank, size=comm.size)):
        call(comm, x)
    assert np.array_equal(x, np.arange(64, dtype=np.float64))
    comm.Barrier()  # no rank sent anything: the next call is unaffected
    assert np.array_equal(ringtree.allgather(np.array([comm.rank]), comm=comm).ravel(), np.arange(comm.size))


def test_ranks_that_disagree_on_the_root_all_get_an_error(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks to disagree")
    local = comm.Dup()
    failures = []
    try:
        ringtree.broadcast(np.zeros(8), root=0 if comm.rank == 0 else 1, comm=local, timeout=30)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if f"ringtree broadcast on rank {comm.rank}" not in str(error) or "'broadcast root 0' on rank 0" not in str(
                error):
            failures.append(str(error))
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
def test_calls_repeated_on_the_same_arrays_see_what_changed_in_them(comm, named):
    """Blocking repeats on the same small arrays run bound to them (again.kept_runs): a change of root, of
    dtype or writability in place, and another collective's calls on the same array in turns must
    all still count, each result equal to MPI's own."""
    rank, size = comm.rank, comm.size
    algorithm, rooted = ("ring", "binomial") if named else ("auto", "auto")
    local = comm.Dup()
    every, block, whole = np.arange(2 * size, dtype=np.int64) + rank, np.empty(2, np.int64), np.empty(2 * size, np.int64)
    expected_block, expected_whole = np.empty(2, np.int64), np.empty(2 * size, np.int64)
    failures = []
    for turn in range(4):
        every[:] = np.arange(2 * size) + rank + turn
        ringtree.reduce_scatter(every, block, comm=local, algorithm=algorithm)
        comm.Reduce_scatter_block(every, expected_block)
        ringtree.allgather(block, whole, comm=local, algorithm=algorithm)
        comm.Allgather(expected_block, expected_whole)
        if not (np.array_equal(block, expected_block) and np.array_equal(whole, expected_whole)):
            failures.append(f"turn {turn}: {block} {whole}")
        root = turn % size
        whole[:] = rank + 10 * turn
        ringtree.broadcast(whole, root=root, comm=local, algorithm=rooted)
        if not (whole == root + 10 * turn).all():
            failures.append(f"broadcast from {root} gave {whole}")
    block.dtype = np.float64  # the same bits read as floats: the repeat must see it
    try:
        ringtree.reduce_scatter(every, block, comm=local, algorithm=algorithm)
        failures.append(f"no error for int64 into {block.dtype}")
    except TypeError as error:
        if "dtype" not in str(error):
            failures.append(str(error))
    block.dtype = np.int64
    ringtree.broadcast(whole, root=0, comm=local, algorithm=rooted)  # the communicator still works
    whole.flags.writeable = False  # fine at the root alone, which only reads it; refused elsewhere
    try:
        ringtree.broadcast(whole, root=0, comm=local, algorithm=rooted)
        if size > 1:
            failures.append("broadcast wrote into a read-only array")
    except (ValueError, ringtree.MismatchError) as error:  # a rank that refused makes the others raise
        if size == 1 or "read-only" not in str(error):
            failures.append(str(error))
    assert_everywhere(comm, failures)
    local.Free()


# Which arrays each turn's call gets: one of two sets made once, or (None) new ones. A shape's first
# call, calls on new arrays, arrays that come again (and are bound then), and bound ones.
TURNS = [None, 0, 1, 1, None, 1, 0, 0, None, 1]


def _turn_arrays(rank, size, turn, made):
    send = np.arange(3 * size, dtype=np.int64) * (rank + 1) + 7 * turn
    if made is None:
        return send, np.empty(3 * size, np.int64)
    made[0][:] = send
    return made


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "started"])
@pytest.mark.parametrize("name", ["allreduce", "allreduce in place", "reduce_scatter", "reduce_scatter counts",
                                  "allgather", "broadcast", "reduce", "reduce in place"])
def test_calls_on_new_arrays_of_a_shape_seen_before_give_mpi_s_result(comm, name, blocking):
    """A shape's calls on other arrays than its first's (a session's shapes: unbound on new arrays, bound once
    arrays come again), each result equal to MPI's own on the same inputs."""
    rank, size = comm.rank, comm.size
    local, failures = comm.Dup(), []
    sets = [(np.empty(3 * size, np.int64), np.empty(3 * size, np.int64)) for _ in range(2)]
    counts = [3 * r % 4 for r in range(size)]
    counts[0] += 3 * size - sum(counts)
    for turn, which in enumerate(TURNS):
        send, recv = _turn_arrays(rank, size, turn, None if which is None else sets[which])
        expected, root = np.empty_like(recv), turn % size
        if name.startswith("allreduce"):
            in_place = name.endswith("in place")
            if in_place:
                recv[:] = send
            comm.Allreduce(send, expected)
            got = (ringtree.allreduce if blocking else ringtree.iallreduce)(
                MPI.IN_PLACE if in_place else send, recv, comm=local)
            compared = recv, expected
        elif name.startswith("reduce_scatter"):
            given = list(counts) if name.endswith("counts") else None  # a new list each call
            mine = counts[rank] if given else 3
            comm.Reduce_scatter(send, expected[:mine], given or [3] * size)
            got = (ringtree.reduce_scatter if blocking else ringtree.ireduce_scatter)(send, recv, given, comm=local)
            compared = recv[:mine], expected[:mine]
        elif name == "allgather":
            comm.Allgather(send[:3], expected)
            got = (ringtree.allgather if blocking else ringtree.iallgather)(send[:3].copy(), recv, comm=local)
            compared = recv, expected
        elif name == "broadcast":
            expected[:] = send if rank == root else 0
            comm.Bcast(expected, root)
            recv[:] = send if rank == root else 0
            got = (ringtree.broadcast if blocking else ringtree.ibroadcast)(recv, root, comm=local)
            compared = recv, expected
        else:
            in_place = name.endswith("in place") and rank == root
            if in_place:
                recv[:] = send
            comm.Reduce(send, expected, root=root)
            got = (ringtree.reduce if blocking else ringtree.ireduce)(MPI.IN_PLACE if in_place else send, recv,
                                                                      root=root, comm=local)
            compared = (recv, expected) if rank == root else (recv[:0], expected[:0])
        if not blocking:
            got.wait()
        if not np.array_equal(*compared):
            failures.append(f"turn {turn} ({'new arrays' if which is None else f'set {which}'}): {compared}")
    assert_everywhere(comm, failures)
    local.Free()


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "started"])
@pytest.mark.parametrize("name", ["allreduce", "reduce_scatter", "allgather", "reduce"])
def test_calls_that_make_their_result_on_arrays_of_a_shape_seen_before_give_mpi_s_result(comm, name, blocking):
    """recvbuf None, a new result each call, on new send arrays and on one that comes again, turn by turn
    (the arrangement of each call's arguments seen before: shapes.of_arrangement): each result MPI's own."""
    rank, size = comm.rank, comm.size
    local, failures, again = comm.Dup(), [], np.empty(3 * size, np.int64)
    for turn, which in enumerate(TURNS):
        send = np.arange(3 * size, dtype=np.int64) * (rank + 1) + 7 * turn
        if which is not None:
            again[:] = send
            send = again
        root = turn % size
        started = getattr(ringtree, name if blocking else "i" + name)(send, comm=local,
                                                                       **({"root": root} if name == "reduce" else {}))
        got = started if blocking else started.wait()
        expected = np.empty(3 * size * (size if name == "allgather" else 1), np.int64)
        if name == "allreduce":
            comm.Allreduce(send, expected)
        elif name == "reduce_scatter":
            expected = expected[:3]
            comm.Reduce_scatter_block(send, expected)
        elif name == "allgather":
            comm.Allgather(send, expected)
        else:
            comm.Reduce(send, expected, root=root)
            expected = expected if rank == root else None
        if (got is None) != (expected is None) or (got is not None and not np.array_equal(got.reshape(-1), expected)):
            failures.append(f"turn {turn}: {got} != {expected}")
    assert_everywhere(comm, failures)
    local.Free()


@pytest.mark.parametrize("repeat", [False, True], ids=["first call", "repeat"])
@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "started"])
@pytest.mark.parametrize("name,op", [("broadcast", None), ("reduce", MPI.SUM), ("reduce", MPI.MAX), ("reduce", MPI.MIN),
                                     ("reduce", MPI.BAND)])
def test_ranks_that_each_name_themselves_the_root_of_a_small_rooted_call_all_get_an_error(comm, name, op, blocking,
                                                                                           repeat):
    """Untimed, a small broadcast or reduce runs as MPI's own allreduce with no comparison first (roots.py):
    every rank naming itself the root (each would only send, or only receive) still raises MismatchError
    on every rank, on the communicator's first call of the shape and on a repeat of it, and the
    communicator goes on working, with MPI's result."""
    if comm.size < 2:
        pytest.skip("needs two ranks to disagree")
    local, failures = comm.Dup(), []
    x, y = np.full(3, comm.rank + 1, np.int32), np.zeros(3, np.int32)

    def call(root):
        if name == "broadcast":
            made = (ringtree.broadcast if blocking else ringtree.ibroadcast)(x, root=root, comm=local)
        else:
            made = (ringtree.reduce if blocking else ringtree.ireduce)(x, y, op, root=root, comm=local)
        if not blocking:
            made.wait()

    if repeat:
        call(0)
    try:
        call(comm.rank)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if f"ringtree {name} on rank {comm.rank}" not in str(error) or (
                f"'{name} root {comm.size - 1}' on rank {comm.size - 1}" not in str(error)):
            failures.append(str(error))
    x[:], y[:] = comm.rank + 1, 0
    expected = np.full(3, comm.size, np.int32)
    if name == "reduce":
        comm.Reduce(x, expected, op, root=comm.size - 1)
    call(comm.size - 1)
    if comm.rank == comm.size - 1 and not np.array_equal(x if name == "broadcast" else y, expected):
        failures.append(f"the call after: {x if name == 'broadcast' else y}, not {expected}")
    if name == "broadcast" and not (x == comm.size).all():
        failures.append(f"the broadcast after: {x}")
    assert_everywhere(comm, failures)
    local.Free()


@pytest.mark.parametrize("name", ["reduce_scatter", "allgather"])
def test_ranks_that_differ_in_a_call_run_a_step_at_a_time_all_get_an_error(comm, name):
    """A blocking untimed call of an unsplit schedule runs stepwise: ranks that differ in its count
    get MismatchError on every rank, not a wait for ever."""
    if comm.size < 2:
        pytest.skip("needs two ranks to differ")
    local, call = comm.Dup(), getattr(ringtree, name)
    call(np.ones(4 * comm.size), algorithm="ring", comm=local)  # the communicator's first call, alike
    failures = []
    try:
        call(np.ones((3 if comm.rank == 0 else 5) * comm.size), algorithm="ring", comm=local)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if f"on rank {comm.rank}" not in str(error):
            failures.append(str(error))
    assert_everywhere(comm, failures)


def test_persistent_collectives_give_mpi_s_result_at_every_start(comm, monkeypatch):
    n, rank = comm.size, comm.rank
    counts = _uneven(comm)
    x = _values(sum(counts), np.dtype(np.int64), rank)
    blocks, theirs = np.zeros(counts[rank], np.int64), np.empty(counts[rank], np.int64)
    comm.Reduce_scatter(x, theirs, counts)
    gathered, everyone = np.zeros((n, 3), np.int64), np.empty((n, 3), np.int64)
    comm.Allgather(np.arange(3) + rank, everyone)
    total, reduced = np.zeros(5, np.int64), np.empty(5, np.int64)
    comm.Reduce(np.arange(5) * (rank + 1), reduced, MPI.SUM, n - 1)
    requests = [ringtree.reduce_scatter_init(x, blocks, counts, comm=comm),
                ringtree.allgather_init(np.arange(3) + rank, gathered, comm=comm),
                ringtree.reduce_init(np.arange(5) * (rank + 1), total if rank == n - 1 else None, root=n - 1, comm=comm)]
    # The Starts past the first take the start kept for their arrays, as the i-functions do; a list of
    # counts, which may change in place, keeps the reduce-scatter's off it (again.BY_VALUE).
    one_path, run = [], persistent.run

    def counted_run(name, *arguments):
        one_path.append(name)
        return run(name, *arguments)
    for turn in range(4):
        if turn == 2:
            monkeypatch.setattr(persistent, "run", counted_run)
        blocks[:], gathered[:], total[:] = -1, -1, -1
        for request in requests:
            request.Start()
        for request in requests:
            request.Wait()
        assert np.array_equal(blocks, theirs) and np.array_equal(gathered, everyone)
        assert rank != n - 1 or np.array_equal(total, reduced)
    for request in requests:
        request.Free()
    assert one_path == ["reduce_scatter"] * 2
    with pytest.raises(ValueError, match=f"ringtree allgather_init on rank {rank}: a persistent allgather needs recvbuf"):
        ringtree.allgather_init(np.arange(3), None, comm=comm)


@pytest.mark.parametrize("name", ["reduce_scatter", "allgather", "broadcast", "reduce"])
def test_a_rank_that_never_joins_gives_a_timeout_not_a_hang(comm, name):
    if comm.size < 2:
        pytest.skip("needs a rank to stay away")
    import time
    local, missing = comm.Dup(), comm.size - 1
    ringtree.allgather(np.ones(1), comm=local)  # sets the communicator up: every rank takes part
    outcome = "stayed away"
    if comm.rank != missing:
        x = np.ones(1024 * comm.size)
        options = dict(comm=local, timeout=1.0)
        call = {"reduce_scatter": lambda: ringtree.reduce_scatter(x, **options),
                "allgather": lambda: ringtree.allgather(x, **options),
                "broadcast": lambda: ringtree.broadcast(x, 0, **options),
                "reduce": lambda: ringtree.reduce(x, root=0, **options)}[name]
        started = time.perf_counter()
        try:
            call()
            outcome = "done"  # a rank whose part needs nothing of the missing one's
        except ringtree.TimeoutError:
            outcome = f"timeout after {time.perf_counter() - started:.1f} s"
    outcomes = comm.allgather(outcome)
    timeouts = [o for o in outcomes if o.startswith("timeout")]
    failures = [] if timeouts and all(float(o.split()[2]) < 5 for o in timeouts) else [outcomes]
    assert_everywhere(comm, failures)
