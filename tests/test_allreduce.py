"""allreduce against the MPI library's own Allreduce, on every rank, for every op and dtype."""

import hashlib

import numpy as np
import pytest
from mpi4py import MPI

from conftest import assert_everywhere, same_on_all_ranks, value_bits
from ringtree.algorithms import ALGORITHMS as CATALOGUE
from ringtree.allreduce import allreduce, iallreduce
from ringtree.errors import TimeoutError
from ringtree.ops import ReduceOp, check_dtype
from ringtree.runtime.session.state import comm_state
from ringtree.tuning.online import MAX_SCHEDULES, TRIALS_SMALL

pytestmark = pytest.mark.mpi

# On one node the hierarchical allreduce is the ring (tests/test_topology.py); it runs across hosts in
# tests/test_hosts.py.
ALGORITHMS = sorted(set(CATALOGUE) - {"hierarchical"}) + ["auto"]
DTYPES = [np.dtype(t) for t in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "longdouble", "complex64", "complex128", "clongdouble")]
# Every op a user may pass (MPI.Op objects and strings), with what it means.
OPS = [
    (MPI.SUM, ReduceOp.SUM), (MPI.PROD, ReduceOp.PROD), (MPI.MIN, ReduceOp.MIN), (MPI.MAX, ReduceOp.MAX),
    (MPI.LAND, ReduceOp.LAND), (MPI.LOR, ReduceOp.LOR), (MPI.LXOR, ReduceOp.LXOR),
    (MPI.BAND, ReduceOp.BAND), (MPI.BOR, ReduceOp.BOR), (MPI.BXOR, ReduceOp.BXOR),
    ("sum", ReduceOp.SUM), ("prod", ReduceOp.PROD), ("min", ReduceOp.MIN), ("max", ReduceOp.MAX),
    ("avg", ReduceOp.AVG),
]
NATIVE = {ReduceOp.AVG: MPI.SUM, **{kind: op for op, kind in OPS if isinstance(op, MPI.Op)}}


def supported(kind, dtype):
    try:
        check_dtype(dtype, kind)
        return True
    except TypeError:
        return False


def exact_inputs(kind, dtype, count, rank, seed):
    """Inputs whose reduction is exact in floating point, so any order gives the native result."""
    rng = np.random.default_rng([seed, rank, count, dtype.num])
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if kind is ReduceOp.PROD:
        values = rng.choice([1, 1, 2, -1] if dtype.kind != "u" else [1, 1, 2, 3], count)
        if dtype.kind in "fc":
            values = values * rng.choice([1.0, 0.5], count)
    elif kind in (ReduceOp.LAND, ReduceOp.LOR, ReduceOp.LXOR):
        values = rng.choice([0, 0, 1, 2], count)
    else:
        values = rng.integers(0 if dtype.kind == "u" else -9, 10, count)
    data = values.astype(dtype)
    if dtype.kind == "c":
        if kind is ReduceOp.PROD:
            data *= rng.choice(np.array([1, 1j, -1j], dtype), count)  # rotations keep products exact
        else:
            data.imag = rng.integers(-9, 10, count)
    return data


def _wire(data):
    """What native MPI reduces for `data`: float16 goes as float32 (exact for our inputs)."""
    return data.astype(np.float32) if data.dtype == np.float16 else data


def _native_result(comm, wire, kind, dtype):
    if kind is ReduceOp.AVG:
        wire /= comm.Get_size()
    return wire.astype(dtype)


def native_allreduce(comm, data, kind=ReduceOp.SUM):
    """The MPI library's own Allreduce of the same data."""
    wire = _wire(data)
    result = np.empty_like(wire)
    comm.Allreduce(wire, result, NATIVE[kind])
    return _native_result(comm, result, kind, data.dtype)


def check_against_native(comm, algorithm, count, cases, batch=None):
    """Run every case through native Iallreduce and ringtree iallreduce, all in flight at once
    (in batches of `batch` cases), and compare on every rank."""
    batch = batch or len(cases)
    failures = []
    for first in range(0, len(cases), batch):
        failures += _check_batch(comm, algorithm, count, cases[first:first + batch])
    assert_everywhere(comm, failures)


def _check_batch(comm, algorithm, count, cases):
    inputs = [exact_inputs(kind, dtype, count, comm.Get_rank(), seed=1) for (_, kind), dtype, _ in cases]
    wires = [_wire(data) for data in inputs]
    natives = [np.empty_like(w) for w in wires]
    MPI.Request.Waitall([comm.Iallreduce(w, out, NATIVE[kind])
                         for w, out, ((_, kind), _, _) in zip(wires, natives, cases)])
    originals = [data.copy() for data in inputs]
    requests, outputs = [], []
    for data, ((op, _), _, inplace) in zip(inputs, cases):
        if inplace:
            outputs.append(data.copy())
            requests.append(iallreduce(MPI.IN_PLACE, outputs[-1], op, comm=comm, algorithm=algorithm))
        else:
            outputs.append(None)
            requests.append(iallreduce(data, op=op, comm=comm, algorithm=algorithm))
    results = [r.wait() for r in requests]

    failures = []
    for ((_, kind), dtype, inplace), data, original, result, out, native in zip(
            cases, inputs, originals, results, outputs, natives):
        what = f"{kind.value} {dtype} inplace={inplace}"
        expected = _native_result(comm, native, kind, dtype)
        if out is not None and result is not out:
            failures.append(f"{what}: did not return recvbuf")
        if not np.array_equal(data, original):
            failures.append(f"{what}: sendbuf was modified")
        if result.dtype != dtype or result.shape != data.shape:
            failures.append(f"{what}: result is {result.dtype}{result.shape}")
        elif not np.array_equal(result, expected):  # by value: long double has padding bytes
            wrong = np.flatnonzero(result != expected)
            failures.append(f"{what}: {wrong.size} elements differ from native, first at {wrong[:1]}: "
                            f"{result[wrong[:1]]} != {expected[wrong[:1]]}")
    digests = [hashlib.sha256(value_bits(r)).digest() for r in results]
    everyone = comm.allgather(digests)
    failures += [f"{kind.value} {dtype} inplace={inplace}: ranks disagree"
                 for i, ((_, kind), dtype, inplace) in enumerate(cases) if len({d[i] for d in everyone}) > 1]
    return failures


def _every_pair():
    return [(op, dtype) for op in OPS for dtype in DTYPES if supported(op[1], dtype)]


def _every_case():
    return [(op, dtype, inplace) for op, dtype in _every_pair() for inplace in (False, True)]


def _small_counts(nranks):
    return sorted({0, 1, max(nranks - 1, 0), nranks, nranks + 1, 61})


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_op_and_dtype_at_small_counts(comm, algorithm):
    for count in _small_counts(comm.Get_size()):
        check_against_native(comm, algorithm, count, _every_case())


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_op_and_dtype_at_a_mebi_element_count(comm, algorithm):
    # Each op and dtype pair runs once, in place and out of place alternately (both are run for every
    # pair above). Ring and tree take every pair up to 4 ranks; the other algorithms, and all at 8
    # ranks (4 to a core in CI, where ring and tree took 90 s of it), every dtype with SUM and every
    # op on int32, which keeps CI in budget.
    check_against_native(comm, algorithm, MEBI, _mebi_cases(algorithm, comm.Get_size()), batch=8)


MEBI = (1 << 20) + 3  # not a multiple of any rank count above 1, so ring chunks are uneven


def _mebi_cases(algorithm, nranks):
    pairs = _every_pair()
    if algorithm not in ("ring", "tree") or nranks > 4:
        pairs = [(op, dtype) for op, dtype in pairs if op[0] is MPI.SUM or dtype == np.dtype("int32")]
    return [(op, dtype, i % 2 == 1) for i, (op, dtype) in enumerate(pairs)]


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() < 6, reason="splits 5 ranks off a world of 6 or more (CI: 8)")
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_op_and_dtype_on_five_ranks_and_the_rest(comm, algorithm):
    # The test suite runs at 2, 3, 4 and 8 ranks; 5 (odd, neither a power of two nor one less) and,
    # at 8, 3 come from splitting the world, both pieces at once.
    piece = comm.Split(int(comm.Get_rank() >= 5), comm.Get_rank())
    try:
        failures = []
        for count in _small_counts(piece.Get_size()):
            failures += _check_batch(piece, algorithm, count, _every_case())
        # The mebi-element count too, every dtype with SUM (every op ran above), to keep CI in budget.
        cases = [case for case in _mebi_cases(algorithm, piece.Get_size()) if case[0][0] is MPI.SUM]
        for first in range(0, len(cases), 8):
            failures += _check_batch(piece, algorithm, MEBI, cases[first:first + 8])
        assert_everywhere(comm, [f"on {piece.Get_size()} ranks: {failure}" for failure in failures])
    finally:
        piece.Free()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_random_floats_are_bitwise_equal_on_all_ranks_and_repeatable(comm, algorithm):
    data = np.random.default_rng(comm.Get_rank()).standard_normal((3, 1000, 7)).astype(np.float32)
    if algorithm == "auto":  # while online tuning tries candidates, each adds in its own order: repeatable once committed
        for _ in range(TRIALS_SMALL * (MAX_SCHEDULES + 1) + 1):
            allreduce(data, comm=comm)
    first = allreduce(data, comm=comm, algorithm=algorithm)
    again = allreduce(data, comm=comm, algorithm=algorithm)
    expected = native_allreduce(comm, data)
    failures = []
    if not same_on_all_ranks(comm, first):
        failures.append("ranks disagree")
    if not np.array_equal(first, again):
        failures.append("a repetition gave other bits")
    if not np.allclose(first, expected, rtol=1e-5, atol=1e-5):
        failures.append("far from native")
    assert_everywhere(comm, failures)


def test_many_outstanding_iallreduce_waited_in_reverse(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    shapes = [(0,), (1,), (size + 1,), (1000,), (64, 1024), (7, 3), (100_003,)]
    inputs = [np.full(shape, rank + i, np.int64) for i, shape in enumerate(shapes)]
    requests = [iallreduce(x, comm=comm, algorithm=ALGORITHMS[i % len(ALGORITHMS)]) for i, x in enumerate(inputs)]
    requests.append(iallreduce(MPI.IN_PLACE, inputs[-1].copy(), "max", comm=comm))
    done_early = requests[0].test()
    results = [r.wait() for r in reversed(requests)][::-1]
    failures = [] if done_early else ["an empty allreduce was not done at once"]
    for i, (x, got) in enumerate(zip(inputs, results[:-1])):
        if got.shape != x.shape or not (got == sum(range(i, i + size))).all():
            failures.append(f"request {i} wrong")
    if not (results[-1] == size - 1 + len(shapes) - 1).all():
        failures.append("in-place max wrong")
    assert_everywhere(comm, failures)


def test_recvbuf_is_filled_and_returned(comm):
    data = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = np.zeros_like(data)
    returned = allreduce(data, out, comm=comm)
    assert_everywhere(comm, [] if returned is out and (out == data * comm.Get_size()).all() else ["wrong"])


def test_passing_the_same_array_twice_reduces_in_place(comm):
    data = np.ones(10, np.int32)
    allreduce(data, data, comm=comm)
    assert_everywhere(comm, [] if (data == comm.Get_size()).all() else [f"got {data}"])


def test_sub_communicators(comm):
    half = comm.Split(comm.Get_rank() % 2, comm.Get_rank())
    try:
        data = np.full(33, comm.Get_rank(), np.int64)
        expected = np.empty_like(data)
        half.Allreduce(data, expected)
        got = allreduce(data, comm=half, algorithm="ring")
        assert_everywhere(comm, [] if np.array_equal(got, expected) else ["wrong on the split"])
    finally:
        half.Free()


@pytest.mark.parametrize("algorithm", sorted(CATALOGUE))
def test_segment_sizes_change_nothing_in_the_result(comm, algorithm):
    rng = np.random.default_rng(comm.Get_rank())
    integers = rng.integers(-1000, 1000, 2_003).astype(np.int64)
    floats = rng.standard_normal(2_003).astype(np.float32)
    failures = []
    for data in (integers, floats):
        unsegmented = allreduce(data, comm=comm, algorithm=algorithm, segment=1 << 30)
        for segment in (200, 1000, np.int64(4096), 40_000):
            for inplace in (False, True):
                if inplace:
                    result = data.copy()
                    allreduce(MPI.IN_PLACE, result, comm=comm, algorithm=algorithm, segment=segment)
                else:
                    result = allreduce(data, comm=comm, algorithm=algorithm, segment=segment)
                if value_bits(result) != value_bits(unsegmented):
                    failures.append(f"{data.dtype} segment={segment} inplace={inplace} differs from unsegmented")
        if not same_on_all_ranks(comm, unsegmented):
            failures.append(f"{data.dtype}: ranks disagree")
    expected = native_allreduce(comm, integers)
    if not np.array_equal(allreduce(integers, comm=comm, algorithm=algorithm, segment=64), expected):
        failures.append("integers differ from native")
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("made", ["first on a new communicator", "in check mode"])
def test_a_call_that_waits_for_the_ranks_while_an_iallreduce_is_in_flight_lets_it_progress(comm, made):
    """A call that waits for every rank before it moves data (a communicator's set-up at its first call, check
    mode's comparison), made by one rank before it waits for an iallreduce in flight and by the others
    after: its wait moves the iallreduce, which the others wait in for this rank's part, so neither
    waits forever; both results are MPI's own."""
    rank, size = comm.rank, comm.size
    busy, fresh, failures = comm.Dup(), comm.Dup(), []
    data = np.full(4, rank + 1, np.int64)
    iallreduce(np.ones(4, np.int64), comm=busy).wait()  # set up, so that only the call below is a first
    request = iallreduce(np.full(1 << 18, rank, np.int64), comm=busy, algorithm="ring", segment=1 << 14)

    def call():
        return allreduce(data, comm=fresh) if made.startswith("first") else allreduce(data, comm=busy, check=True)
    if rank == 0:
        got = call()
        total = request.wait()
    else:
        total = request.wait()
        got = call()
    expected = np.empty_like(data)
    comm.Allreduce(data, expected)
    if not np.array_equal(got, expected) or not (total == size * (size - 1) // 2).all():
        failures.append(f"{got} != {expected}, or the iallreduce in flight went wrong")
    assert_everywhere(comm, failures)
    busy.Free()
    fresh.Free()


def test_blocking_allreduce_while_others_are_in_flight_waited_in_another_order(comm):
    # A small blocking allreduce must keep earlier nonblocking ones moving: here rank 0 runs it
    # before waiting on a large pipelined iallreduce, while the other ranks wait on that first.
    rank, size = comm.Get_rank(), comm.Get_size()
    big = np.full(1 << 20, rank, np.int64)
    request = iallreduce(big, comm=comm, algorithm="ring", segment=1 << 16)
    if rank == 0:
        small = allreduce(np.array([rank + 1], np.int32), comm=comm)
        result = request.wait()
    else:
        result = request.wait()
        small = allreduce(np.array([rank + 1], np.int32), comm=comm)
    failures = []
    if not (result == size * (size - 1) // 2).all():
        failures.append("large iallreduce wrong")
    if small[0] != size * (size + 1) // 2:
        failures.append(f"small allreduce gave {small[0]}")
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "tree", "auto"])
def test_a_call_repeated_on_the_same_arrays_sees_what_changed_in_them(comm, algorithm):
    # Repeats on the same small arrays skip most checks (again.kept_runs): what may change in place
    # between calls must still count.
    rank, size = comm.Get_rank(), comm.Get_size()
    data, out = np.full(6, rank + 1, np.int32), np.empty(6, np.int32)
    failures = []
    allreduce(data, out, "max", comm=comm, algorithm=algorithm)
    if not (out == size).all():
        failures.append(f"max gave {out}")
    for _ in range(3):
        allreduce(data, out, comm=comm, algorithm=algorithm)
        if not (out == size * (size + 1) // 2).all():
            failures.append(f"sum gave {out}")
    # The same bits read as floats: the receive array, the send array too, then one back and forth.
    for changed, dtype in ((out, np.float32), (data, np.float32), (data, np.int32), (data, np.float32)):
        changed.dtype = dtype
        try:
            allreduce(data, out, comm=comm, algorithm=algorithm)
            if data.dtype != out.dtype:
                failures.append(f"no error for {data.dtype} into {out.dtype}")
        except TypeError as error:
            if data.dtype == out.dtype or "dtype" not in str(error):
                failures.append(f"{data.dtype} into {out.dtype}: {error}")
    data[...] = rank + 1
    allreduce(data, out, comm=comm, algorithm=algorithm)
    if not (out == size * (size + 1) // 2).all():
        failures.append(f"after the dtype changed: {out}")
    allreduce(data, data, comm=comm, algorithm=algorithm)  # the send array as the receive one: in place
    if not (data == size * (size + 1) // 2).all():
        failures.append(f"in place gave {data}")
    out.flags.writeable = False
    try:
        allreduce(data, out, comm=comm, algorithm=algorithm)
        failures.append("wrote into a read-only array")
    except ValueError as error:
        if "read-only" not in str(error):
            failures.append(f"read-only: {error}")
    # With a collective in flight, a repeat must let it progress (the stepwise path does not).
    out = np.empty(6, np.float32)
    allreduce(data, out, comm=comm, algorithm=algorithm)
    big = np.full(1 << 18, rank, np.int64)
    request = iallreduce(big, comm=comm, algorithm="ring", segment=1 << 14)
    if rank == 0:
        allreduce(data, out, comm=comm, algorithm=algorithm)
        result = request.wait()
    else:
        result = request.wait()
        allreduce(data, out, comm=comm, algorithm=algorithm)
    if not (result == size * (size - 1) // 2).all() or not (out == size * size * (size + 1) // 2).all():
        failures.append("a repeat with an iallreduce in flight went wrong")
    assert_everywhere(comm, failures)


def test_a_communicator_made_unusable_is_refused_even_for_a_repeated_call(comm):
    dup = comm.Dup()
    data, out = np.ones(4, np.int32), np.empty(4, np.int32)
    for _ in range(3):
        allreduce(data, out, comm=dup, algorithm="tree")
    comm_state(dup).broken = TimeoutError("a rank did not come")  # as a timeout leaves it
    with pytest.raises(TimeoutError, match="unusable"):
        allreduce(data, out, comm=dup, algorithm="tree")
    dup.Free()
    with pytest.raises(TypeError, match="intracommunicator"):  # freed: MPI.COMM_NULL
        allreduce(data, out, comm=dup)
    allreduce(data, out, comm=comm)
    assert_everywhere(comm, [] if (out == comm.Get_size()).all() else [f"got {out}"])


def test_a_new_result_each_call_of_a_shape_seen_before_is_right_whatever_the_array(comm):
    # Once a shape runs MPI's own, allreduce(x) with a new x each call is kept by its shape
    # (again._NewResult): what the next x brings that the shape's calls do not share must still count.
    private = comm.Dup()  # a state of its own, so that its small shapes settle in this test
    rank = private.Get_rank()

    def expected(data, op=MPI.SUM):
        data = np.ascontiguousarray(data, data.dtype.newbyteorder("="))  # what MPI's own takes
        out = np.empty_like(data)
        private.Allreduce(data, out, op)
        return out

    failures = []
    for step in range(150):  # past online tuning's trials of the shape
        data = np.full(2, rank + step, np.float64)
        result = allreduce(data, comm=private)
        if result is data or not np.array_equal(result, expected(data)):
            failures.append(f"call {step}: {result}")
            break
    others = {"2-D": np.full((1, 2), rank + 1.0), "a strided view": np.arange(4.0)[::2] + rank,
              "read-only": np.full(2, rank + 2.0), "int64": np.full(2, rank + 3, np.int64),
              "3 elements": np.full(3, rank + 4.0), "big-endian": np.full(2, rank + 5.0, ">f8")}
    others["read-only"].flags.writeable = False
    for name, data in others.items():
        result = allreduce(data, comm=private)
        if result.shape != data.shape or result.dtype != data.dtype or not np.array_equal(result, expected(data)):
            failures.append(f"{name}: {result!r}")
    result = allreduce(np.full(2, rank + 6.0), None, MPI.MAX, comm=private)
    if not np.array_equal(result, expected(np.full(2, rank + 6.0), MPI.MAX)):
        failures.append(f"max: {result}")
    with pytest.raises(TypeError, match=f"on rank {rank}"):  # checked as a first call is
        allreduce(np.full(2, "x", object), comm=private)
    if not np.array_equal(allreduce(np.full(2, rank + 7.0), comm=private), expected(np.full(2, rank + 7.0))):
        failures.append("after a refused call")
    private.Free()
    assert_everywhere(comm, failures)
