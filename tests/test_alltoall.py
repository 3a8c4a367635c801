"""alltoall against MPI's own Alltoall on the same inputs, exactly: every algorithm x every dtype; block
sizes 0, 1, primes and more than a segment; in place and not, into a new array; blocking, nonblocking
and persistent; through ringtree.Communicator; calls repeated on the same arrays; bad input refused
before any message; ranks that disagree get an error. Given counts, against MPI's Alltoallv likewise."""

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere
from ringtree.algorithms import GENERATORS

pytestmark = pytest.mark.mpi

ALGORITHMS = ["auto", *sorted(GENERATORS["alltoall"])]
TYPECODES = "?bBhHiIlLqQefdgFDG"
SEGMENT = 64  # bytes: a block of more than 8 float64 is pipelined


def _input(comm, block, dtype):
    """Rank r's input: N blocks, block d holding values of (r, d), so that a misplaced one shows."""
    values = (np.arange(comm.size * block) + 1000 * comm.rank) % 251
    return (values % 2 == 0 if np.dtype(dtype).kind == "b" else values).astype(dtype)


def _mpi_s(comm, x):
    expected = np.empty_like(x)
    comm.Alltoall(x, expected)
    return expected


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_alltoall_of_every_dtype(comm, algorithm):
    failures = []
    for typecode in TYPECODES:
        x = _input(comm, 3, np.dtype(typecode))
        got = ringtree.alltoall(x, comm=comm, algorithm=algorithm)
        if got.dtype != x.dtype or not np.array_equal(got, _mpi_s(comm, x)):
            failures.append(f"{algorithm} {np.dtype(typecode)}: differs from MPI's")
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("segment", [None, SEGMENT])
def test_alltoall_of_every_block_size_in_place_and_not(comm, algorithm, segment):
    if algorithm == "auto" and segment:
        pytest.skip("auto chooses its own segments")
    failures = []
    for block in (0, 1, 2, 7, 97, 1000):
        x = _input(comm, block, np.int64)
        expected = _mpi_s(comm, x)
        options = dict(comm=comm, algorithm=algorithm, segment=segment)
        into = np.full_like(x, -1)
        in_place = x.copy()
        results = {"new": ringtree.alltoall(x, **options), "into": ringtree.alltoall(x, into, **options),
                   "in place": ringtree.alltoall(MPI.IN_PLACE, in_place, **options)}
        started = np.full_like(x, -1)
        results["started"] = ringtree.ialltoall(x, started, **options).wait()
        for how, got in results.items():
            if not np.array_equal(got, expected):
                failures.append(f"{algorithm} segment {segment}, blocks of {block}, {how}: differs from MPI's")
        if results["in place"] is not in_place or results["into"] is not into:
            failures.append("not recvbuf returned")
    assert_everywhere(comm, failures)


def test_a_new_result_keeps_sendbufs_shape_and_kind(comm):
    x = _input(comm, 4, np.float32).reshape(comm.size, 4)
    got = ringtree.alltoall(x, comm=comm)
    assert_everywhere(comm, [] if got.shape == x.shape and np.array_equal(got, _mpi_s(comm, x)) else
                      [f"got shape {got.shape}"])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_persistent_alltoall_gives_mpi_s_result_at_every_start(comm, algorithm):
    x, out = _input(comm, 5, np.int32), np.empty(5 * comm.size, np.int32)
    request = ringtree.alltoall_init(x, out, comm=comm, algorithm=algorithm)
    failures = []
    for turn in range(3):
        x[:] = _input(comm, 5, np.int32) + turn
        request.Start()
        request.Wait()
        if not np.array_equal(out, _mpi_s(comm, x)):
            failures.append(f"{algorithm}, start {turn}: differs from MPI's")
    request.Free()
    assert_everywhere(comm, failures)


def test_calls_repeated_on_the_same_arrays_see_their_new_contents(comm):
    x, out = _input(comm, 2, np.int64), np.empty(2 * comm.size, np.int64)
    failures = []
    for turn in range(20):  # past the repeat's binding to these arrays (again.kept_runs)
        x[:] = _input(comm, 2, np.int64) * (turn + 1)
        ringtree.alltoall(x, out, comm=comm)
        if not np.array_equal(out, _mpi_s(comm, x)):
            failures.append(f"call {turn}: differs from MPI's")
    assert_everywhere(comm, failures)


def test_the_communicator_s_alltoall_forms(comm):
    ours = ringtree.Communicator(comm)
    x = _input(comm, 6, np.float64)
    expected = _mpi_s(comm, x)
    failures = []
    out = np.empty_like(x)
    ours.Alltoall(x, out)
    failures += [] if np.array_equal(out, expected) else ["Alltoall"]
    out = np.empty_like(x)
    ours.Ialltoall(x, out).Wait()
    failures += [] if np.array_equal(out, expected) else ["Ialltoall"]
    out = np.empty_like(x)
    request = ours.Alltoall_init(x, out)
    request.Start()
    request.Wait()
    request.Free()
    failures += [] if np.array_equal(out, expected) else ["Alltoall_init"]
    in_place = x.copy()
    ours.Alltoall(MPI.IN_PLACE, in_place)
    failures += [] if np.array_equal(in_place, expected) else ["Alltoall in place"]
    assert_everywhere(comm, failures)


def _count_matrix(comm, seed):
    """What each rank sends each (0 to 9 elements), alike on every rank."""
    return np.random.default_rng(seed).integers(0, 10, (comm.size, comm.size))


def _mpi_v(comm, x, matrix):
    expected = np.empty(matrix[:, comm.rank].sum(), x.dtype)
    comm.Alltoallv([x, matrix[comm.rank].tolist()], [expected, matrix[:, comm.rank].tolist()])
    return expected


@pytest.mark.parametrize("algorithm", ["auto", "pairwise"])
@pytest.mark.parametrize("segment", [None, SEGMENT])
def test_alltoall_given_counts_gives_mpi_s_alltoallv_blocking_nonblocking_and_persistent(comm, algorithm, segment):
    failures = []
    for seed, dtype in enumerate((np.float64, np.int32, np.uint8, np.complex128)):
        matrix = _count_matrix(comm, seed)
        sent, received = matrix[comm.rank].tolist(), matrix[:, comm.rank].tolist()
        x = ((np.arange(sum(sent)) + 1000 * comm.rank) % 251).astype(dtype)
        expected = _mpi_v(comm, x, matrix)
        options = {"comm": comm, "algorithm": algorithm, "segment": segment}
        results = {"new": ringtree.alltoall(x, None, sent, received, **options),
                   "into": ringtree.alltoall(x, np.empty_like(expected), sent, received, **options),
                   "started": ringtree.ialltoall(x, np.empty_like(expected), sent, received, **options).wait()}
        out = np.empty_like(expected)
        request = ringtree.alltoall_init(x, out, sent, received, comm=comm, algorithm=algorithm)
        for turn in range(2):
            request.Start()
            request.Wait()
            results[f"persistent, start {turn}"] = out.copy()
        failures += [f"{dtype.__name__} {how}" for how, got in results.items() if not np.array_equal(got, expected)]
    assert_everywhere(comm, failures)


def test_alltoall_in_place_given_counts_and_counts_alike_everywhere(comm):
    failures = []
    symmetric = _count_matrix(comm, 7)
    symmetric = symmetric + symmetric.T  # in place, what a rank sends each is what it receives from it
    x = np.arange(symmetric[comm.rank].sum(), dtype=np.float64) + 100 * comm.rank
    expected = _mpi_v(comm, x, symmetric)
    ringtree.alltoall(MPI.IN_PLACE, x, None, symmetric[:, comm.rank].tolist(), comm=comm)
    failures += [] if np.array_equal(x, expected) else ["in place"]
    alike = np.full((comm.size, comm.size), 3)  # runs as an alltoall of blocks alike
    x = np.arange(3 * comm.size, dtype=np.float64) + 100 * comm.rank
    got = ringtree.alltoall(x, None, [3] * comm.size, [3] * comm.size, comm=comm, algorithm="bruck")
    failures += [] if np.array_equal(got, _mpi_v(comm, x, alike)) else ["alike, bruck"]
    assert_everywhere(comm, failures)


def test_the_communicator_s_alltoallv_forms_run_on_ringtree(comm):
    ours = ringtree.Communicator(comm)
    matrix = _count_matrix(comm, 3)
    sent, received = matrix[comm.rank].tolist(), matrix[:, comm.rank].tolist()
    x = np.arange(sum(sent), dtype=np.float64) + 100 * comm.rank
    expected = _mpi_v(comm, x, matrix)
    failures = []
    out = np.empty_like(expected)
    ours.Alltoallv([x, sent], [out, received])
    failures += [] if np.array_equal(out, expected) else ["Alltoallv"]
    out = np.empty_like(expected)
    ours.Ialltoallv([x, (sent, None), MPI.DOUBLE], [out, (received, None), MPI.DOUBLE]).Wait()
    failures += [] if np.array_equal(out, expected) else ["Ialltoallv"]
    out = np.empty_like(expected)
    request = ours.Alltoallv_init([x, sent], [out, received])
    request.Start()
    request.Wait()
    request.Free()
    failures += [] if np.array_equal(out, expected) else ["Alltoallv_init"]
    assert_everywhere(comm, failures)


def test_alltoall_given_counts_that_disagree_raises_on_every_rank_and_the_communicator_stays_usable(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks to disagree")
    matrix = _count_matrix(comm, 5)
    sent, received = matrix[comm.rank].tolist(), matrix[:, comm.rank].tolist()
    if comm.rank == 1:
        received[0] += 1
    x = np.zeros(sum(sent))
    before, failures = x.copy(), []
    try:
        ringtree.alltoall(x, np.zeros(sum(received)), sent, received, comm=comm, timeout=60)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if f"rank 0 sends rank 1 {matrix[0, 1]} elements, rank 1 expects {matrix[0, 1] + 1}" not in str(error):
            failures.append(str(error))
    failures += [] if np.array_equal(x, before) else ["sendbuf changed"]
    received[0] = matrix[0, comm.rank]
    got = ringtree.alltoall(x + comm.rank, None, sent, received, comm=comm)
    failures += [] if np.array_equal(got, _mpi_v(comm, x + comm.rank, matrix)) else ["the next call differs"]
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("what, call, message", [
    ("a count that does not split", lambda comm, x: ringtree.alltoall(x[:comm.size * 3 + 1], comm=comm),
     "do not split into"),
    ("too small a recvbuf", lambda comm, x: ringtree.alltoall(x, np.empty(x.size - 1, x.dtype), comm=comm),
     "too few"),
    ("another dtype's recvbuf", lambda comm, x: ringtree.alltoall(x, np.empty(x.size, np.int32), comm=comm),
     "dtype"),
    ("a read-only recvbuf", lambda comm, x: ringtree.alltoall(MPI.IN_PLACE, np.frombuffer(x.tobytes()), comm=comm),
     "read-only"),
    ("an unknown algorithm", lambda comm, x: ringtree.alltoall(x, comm=comm, algorithm="ring"), "unknown"),
    ("too few counts", lambda comm, x: ringtree.alltoall(x, None, [1] * (comm.size + 1), [1] * comm.size, comm=comm),
     "sendcounts: counts must be"),
    ("recvcounts missing", lambda comm, x: ringtree.alltoall(x, None, [1] * comm.size, comm=comm),
     "recvcounts is None"),
    ("counts beyond sendbuf", lambda comm, x: ringtree.alltoall(x, None, [x.size + 1] * comm.size, [1] * comm.size,
                                                                comm=comm), "too few for the"),
    ("a persistent one without recvbuf", lambda comm, x: ringtree.alltoall_init(x, None, [1] * comm.size,
                                                                              [1] * comm.size, comm=comm),
     "needs recvbuf"),
])
def test_bad_input_is_refused_before_any_message_and_buffers_are_left_alone(comm, what, call, message):
    if comm.size == 1 and what == "a count that does not split":
        pytest.skip("every count splits into one block")
    x = _input(comm, 4, np.float64)
    before = x.copy()
    with pytest.raises((ValueError, TypeError), match=message) as raised:
        call(comm, x)
    failures = [] if f"on rank {comm.rank}" in str(raised.value) else [f"{what}: {raised.value} names no rank"]
    failures += [] if np.array_equal(x, before) else [f"{what}: sendbuf changed"]
    comm.Barrier()  # no rank sent anything: all are still in step
    assert_everywhere(comm, failures)


def test_ranks_that_disagree_on_the_block_size_all_get_an_error(comm):
    if comm.size < 2:
        pytest.skip("needs two ranks to disagree")
    local = comm.Dup()
    failures = []
    try:
        ringtree.alltoall(np.zeros(comm.size * (3 + comm.rank)), comm=local, algorithm="pairwise", timeout=30)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if f"ringtree alltoall on rank {comm.rank}" not in str(error):
            failures.append(str(error))
    assert_everywhere(comm, failures)

