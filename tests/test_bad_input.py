"""Bad arguments raise on every rank before any message is sent, and leave the buffers alone."""

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere
from ringtree.allreduce import allreduce, iallreduce
from ringtree.runtime.session.state import comm_state

pytestmark = pytest.mark.mpi


def _read_only(array):
    array.flags.writeable = False
    return array


# (id, sendbuf, recvbuf, keyword arguments, exception, words the message must contain)
CASES = [
    ("non-contiguous sendbuf", lambda: np.arange(10.0)[::2], None, {}, ValueError, "sendbuf is not contiguous"),
    ("non-contiguous recvbuf", lambda: np.arange(5.0), lambda: np.zeros(10)[::2], {}, ValueError,
     "recvbuf is not contiguous"),
    ("neither C- nor Fortran-ordered", lambda: np.ones((3, 4))[:, :2], None, {}, ValueError, "not contiguous"),
    ("sizes differ", lambda: np.ones(6), lambda: np.zeros(7), {}, ValueError, "sendbuf has 6 elements but recvbuf has 7"),
    ("dtypes differ", lambda: np.ones(4, np.float32), lambda: np.zeros(4, np.float64), {}, TypeError,
     "dtype float32 but recvbuf has dtype float64"),
    ("read-only recvbuf", lambda: np.ones(4), lambda: _read_only(np.zeros(4)), {}, ValueError, "recvbuf is read-only"),
    ("read-only in place", lambda: MPI.IN_PLACE, lambda: _read_only(np.ones(4)), {}, ValueError, "read-only"),
    ("in place without recvbuf", lambda: MPI.IN_PLACE, None, {}, ValueError, "recvbuf must hold the input"),
    ("object dtype", lambda: np.array([1, 2], dtype=object), None, {}, TypeError, "dtype object cannot be reduced"),
    ("string dtype", lambda: np.array(["ab", "cd"]), None, {}, TypeError, "cannot be reduced"),
    ("datetime dtype", lambda: np.array(["2026-01-01"], dtype="datetime64[D]"), None, {}, TypeError,
     "cannot be reduced"),
    ("BAND on floats", lambda: np.ones(4), None, {"op": MPI.BAND}, TypeError, "op band is not defined for dtype float64"),
    ("MAX on complex", lambda: np.ones(4, complex), None, {"op": MPI.MAX}, TypeError, "max is not defined"),
    ("avg on integers", lambda: np.ones(4, np.int32), None, {"op": "avg"}, TypeError, "avg is not defined"),
    ("SUM on bool", lambda: np.ones(4, bool), None, {"op": MPI.SUM}, TypeError, "sum is not defined for dtype bool"),
    ("LAND on floats", lambda: np.ones(4), None, {"op": MPI.LAND}, TypeError, "land is not defined"),
    ("MAXLOC on floats", lambda: np.ones(4), None, {"op": MPI.MAXLOC}, TypeError,
     "op MPI.MAXLOC reduces pairs of a value and an index"),
    ("unknown op string", lambda: np.ones(4), None, {"op": "mean"}, ValueError, "unknown op 'mean'"),
    ("op of the wrong type", lambda: np.ones(4), None, {"op": 3}, TypeError, "op must be an MPI.Op or a string"),
    ("unknown algorithm", lambda: np.ones(4), None, {"algorithm": "butterfly"}, ValueError,
     "unknown algorithm 'butterfly'"),
    ("native with a timeout", lambda: np.ones(4), None, {"algorithm": "native", "timeout": 5.0}, ValueError,
     "algorithm 'native' (MPI's own) cannot run a call with a timeout"),
    ("native on float16", lambda: np.ones(4, np.float16), None, {"algorithm": "native"}, ValueError,
     "algorithm 'native' (MPI's own) cannot run sum on float16"),
    ("segment of zero bytes", lambda: np.ones(4), None, {"segment": 0}, ValueError,
     "segment must be a positive number of bytes"),
    ("segment that is not a number", lambda: np.ones(4), None, {"segment": "1M"}, ValueError,
     "segment must be a positive number of bytes, got '1M'"),
    ("a list instead of an array", lambda: [1.0, 2.0], None, {}, TypeError, "got a list whose first item is a float"),
    ("overlapping buffers", "overlap", None, {}, ValueError, "overlap"),
]


def _arguments(make_send, make_recv):
    if make_send == "overlap":
        base = np.ones(10)
        return base[:6], base[4:]
    return make_send(), make_recv() if make_recv else None


def _snapshot(*buffers):
    return [b.copy() if isinstance(b, np.ndarray) else b for b in buffers]


def _unchanged(before, after):
    return all(not isinstance(a, np.ndarray) or np.array_equal(a, b)
               for a, b in zip(before, after))


@pytest.mark.parametrize("function", ["allreduce", "iallreduce"])
@pytest.mark.parametrize("name, make_send, make_recv, kwargs, error, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_before_any_message(comm, function, name, make_send, make_recv, kwargs, error, words):
    state = comm_state(comm)
    calls_before = state.calls
    sendbuf, recvbuf = _arguments(make_send, make_recv)
    before = _snapshot(sendbuf, recvbuf)
    call = allreduce if function == "allreduce" else iallreduce
    failures = []
    with pytest.raises(error) as caught:
        call(sendbuf, recvbuf, comm=comm, **kwargs)
    message = str(caught.value)
    for expected in (words, f"on rank {comm.Get_rank()}"):
        if expected not in message:
            failures.append(f"message {message!r} lacks {expected!r}")
    if not _unchanged(before, [sendbuf, recvbuf]):
        failures.append("a buffer was modified")
    if state.calls != calls_before:
        failures.append("a collective was started")
    failures += _no_stray_messages_and_still_correct(comm, state)
    assert_everywhere(comm, failures)


# Cases with a recvbuf and no other argument: bad arrays that a call of a shape already seen may bring.
ARRAY_CASES = [c for c in CASES if not c[3] and (c[2] is not None or c[1] == "overlap")]


@pytest.mark.parametrize("name, make_send, make_recv, kwargs, error, words", ARRAY_CASES,
                         ids=[c[0] for c in ARRAY_CASES])
def test_bad_arrays_after_good_calls_of_their_shape(comm, name, make_send, make_recv, kwargs, error, words):
    """The lean path skips the checks a repeated call shape has passed; those on the arrays still run."""
    sendbuf, recvbuf = _arguments(make_send, make_recv)
    good = np.ones(recvbuf.shape, recvbuf.dtype)
    for _ in range(2):
        allreduce(good, np.empty_like(good), comm=comm)
        allreduce(MPI.IN_PLACE, good.copy(), comm=comm)
    state = comm_state(comm)
    calls_before = state.calls
    before = _snapshot(sendbuf, recvbuf)
    failures = []
    with pytest.raises(error) as caught:
        allreduce(sendbuf, recvbuf, comm=comm)
    if words not in str(caught.value):
        failures.append(f"message {str(caught.value)!r} lacks {words!r}")
    if not _unchanged(before, [sendbuf, recvbuf]) or state.calls != calls_before:
        failures.append("a buffer was modified or a collective started")
    failures += _no_stray_messages_and_still_correct(comm, state)
    assert_everywhere(comm, failures)


def _no_stray_messages_and_still_correct(comm, state):
    comm.Barrier()
    failures = ["a message is waiting on ringtree's communicator"] if state.comm.Iprobe(MPI.ANY_SOURCE) else []
    data = np.arange(5, dtype=np.int64) + comm.Get_rank()
    expected = np.empty_like(data)
    comm.Allreduce(data, expected)
    if not np.array_equal(allreduce(data, comm=comm), expected):
        failures.append("the next allreduce is wrong")
    return failures


def test_a_bad_communicator_raises(comm):
    with pytest.raises(TypeError, match="intracommunicator"):
        allreduce(np.ones(3), comm="world")
    with pytest.raises(TypeError, match="intracommunicator"):
        allreduce(np.ones(3), comm=MPI.COMM_NULL)
    with pytest.raises(TypeError, match="intracommunicator"):
        ringtree.Communicator(MPI.COMM_NULL)


def test_a_freed_communicator_is_named_as_freed(comm):
    freed = comm.Dup()
    freed.Free()
    for call in (lambda: allreduce(np.ones(3), comm=freed), lambda: iallreduce(np.ones(3), comm=freed),
                 lambda: ringtree.broadcast(np.ones(3), comm=freed), lambda: ringtree.reduce(np.ones(3), comm=freed)):
        with pytest.raises(TypeError, match="comm must be an intracommunicator, got a null one: it was freed"):
            call()


COMMUNICATOR_CASES = [
    ("counts differ", lambda: (np.ones(4), np.zeros(5)), ValueError, "sendbuf has 4 elements but recvbuf has 5"),
    ("an unknown typecode", lambda: ([np.ones(4), "x"], np.zeros(4)), TypeError, "unsupported datatype 'x'"),
    ("too many spec items", lambda: ([np.ones(4), 4, 0, MPI.DOUBLE, 1], np.zeros(4)), TypeError, "2 to 4 items"),
    ("count beyond the buffer", lambda: ([np.ones(4), 5, MPI.DOUBLE], np.zeros(5)), ValueError, "does not fit"),
    ("read-only bytes as recvbuf", lambda: (np.ones(1), bytes(8)), ValueError, "recvbuf is read-only"),
    ("not a buffer", lambda: (np.ones(1), 3.0), TypeError, "expected a buffer, an array or a buffer specification"),
]


@pytest.mark.parametrize("name, make, error, words", COMMUNICATOR_CASES, ids=[c[0] for c in COMMUNICATOR_CASES])
def test_communicator_rejects_bad_buffer_specs(comm, name, make, error, words):
    state = comm_state(comm)
    calls_before = state.calls
    sendbuf, recvbuf = make()
    with pytest.raises(error) as caught:
        ringtree.Communicator(comm).Allreduce(sendbuf, recvbuf)
    failures = [] if words in str(caught.value) and f"on rank {comm.Get_rank()}" in str(caught.value) \
        else [f"message {caught.value} lacks {words!r}"]
    if state.calls != calls_before:
        failures.append("a collective was started")
    failures += _no_stray_messages_and_still_correct(comm, state)
    assert_everywhere(comm, failures)


def _read_only_on_rank_1(comm, array):
    if comm.Get_rank() == 1:
        array.flags.writeable = False
    return array


# (id, the call on a communicator, what rank 1 is told) where rank 1 alone refuses its arguments.
ONE_RANK_CASES = [
    ("allreduce of a read-only recvbuf", lambda c: allreduce(np.ones(4), _read_only_on_rank_1(c, np.zeros(4)), comm=c),
     "recvbuf is read-only"),
    ("iallreduce of an unknown op", lambda c: iallreduce(np.ones(4), op="mean" if c.Get_rank() == 1 else "sum",
                                                         comm=c).wait(), "unknown op 'mean'"),
    ("broadcast of a read-only buffer", lambda c: ringtree.broadcast(_read_only_on_rank_1(c, np.ones(8)), comm=c),
     "buf is read-only"),
    ("reduce-scatter of a non-contiguous buffer", lambda c: ringtree.reduce_scatter(
        np.ones(8 * c.Get_size())[::2] if c.Get_rank() == 1 else np.ones(4 * c.Get_size()), comm=c),
     "sendbuf is not contiguous"),
    ("Communicator.Allgather into a buffer of another size", lambda c: ringtree.Communicator(c).Allgather(
        np.ones(2), np.zeros(2 * c.Get_size() + (c.Get_rank() == 1))), "blocks of sendbuf's 2"),
    ("allreduce_init of a read-only recvbuf, then its first Start", lambda c: _started(
        ringtree.allreduce_init(np.ones(4), _read_only_on_rank_1(c, np.zeros(4)), comm=c)), "recvbuf is read-only"),
]


def _started(request):
    request.Start()
    request.Wait()


@pytest.mark.parametrize("first", [True, False], ids=["its first call", "after a call"])
@pytest.mark.parametrize("name, call, words", ONE_RANK_CASES, ids=[c[0] for c in ONE_RANK_CASES])
def test_arguments_one_rank_refuses_raise_on_every_rank_naming_it(comm, name, call, words, first):
    if comm.Get_size() == 1:
        pytest.skip("needs another rank")
    mine = comm.Dup()
    try:
        if not first:
            allreduce(np.ones(3), comm=mine)
        try:
            call(mine)
            failures = ["returned"]
        except (ValueError, TypeError) as error:
            failures = [] if comm.Get_rank() == 1 and words in str(error) else [f"{type(error).__name__}: {error}"]
        except ringtree.MismatchError as error:
            failures = [] if comm.Get_rank() != 1 and "on rank 1, refused its arguments: " in str(error) \
                and words in str(error) else [f"MismatchError: {error}"]
        with pytest.raises((ringtree.MismatchError, ValueError), match="unusable"):
            allreduce(np.ones(3), comm=mine)  # on every rank at once: none went on
    finally:
        mine.Free()
    assert_everywhere(comm, failures)
