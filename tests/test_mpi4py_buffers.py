"""ringtree.Communicator on every buffer mpi4py's own Allreduce tests make on the host (its
test_cco_buf.py and arrayimpl.py): array.array, numpy (C and Fortran order), objects exporting only
DLPack or only the buffer protocol, buffer specifications with typecodes and datatypes; every
typecode x SUM, PROD, MAX, MIN; out of place, None, IN_PLACE and the same buffer twice; blocking,
nonblocking and persistent. Each result against MPI's own Allreduce of the same inputs, exactly."""

import array

import numpy as np
import pytest
from mpi4py import MPI

import ringtree
from conftest import assert_everywhere, same_on_all_ranks
from ringtree.runtime.engine.native import reduces

pytestmark = pytest.mark.mpi

OPS = {"SUM": MPI.SUM, "PROD": MPI.PROD, "MAX": MPI.MAX, "MIN": MPI.MIN}
ARRAY_TYPECODES = "bBhHiIlLqQfd"  # what array.array holds
NUMPY_TYPECODES = ARRAY_TYPECODES + "egFDG"  # float16, long double, complex
COUNT = 12


class DLPackOnly:
    """An object that exports DLPack and nothing else, as mpi4py's tests' dlpackimpl."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class LegacyDLPack(DLPackOnly):
    """DLPack as before version 1.0, as mpi4py's tests' dlpackimpl exports it: a __dlpack__ that takes
    no max_version gives an unversioned capsule, which says nothing of read-only."""

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__(stream=stream)


class CUDAArrayInterfaceOnly:
    """An object that exports only the CUDA array interface, as mpi4py's tests' FakeGPUArray, here over
    host memory."""

    def __init__(self, array):
        self._array = array

    @property
    def __cuda_array_interface__(self):
        return {**self._array.__array_interface__, "version": 3}


def _inputs(name, typecode, rank, size):
    """Small integers, so that every order of the reduction gives the same values; a PROD of ones
    and one 2 per element."""
    if name == "PROD":
        values = np.ones(COUNT, np.int64)
        values[np.arange(COUNT) % size == rank] = 2
    else:
        values = (np.arange(COUNT) * (rank + 1) + rank) % 7 - (0 if typecode in "BHILQ" else 3)
    return np.array(values, np.dtype(typecode))


def _kinds(typecode):
    """(kind, make a buffer of it from a numpy array of values)."""
    kinds = [
        ("numpy", lambda a: a),
        ("numpy, Fortran order", lambda a: np.asfortranarray(a.reshape(3, 4))),
        ("buffer protocol only", memoryview),
        ("[buf, datatype]", lambda a: [a, MPI.Datatype.fromcode(typecode)]),
        ("[bytes, count, typecode]", lambda a: [a.view(np.uint8), COUNT, typecode]),
        ("(buf, (count, displ), typecode)", lambda a: (a, (COUNT, 0), typecode)),
    ]
    if typecode not in "gG":  # DLPack has no long double
        kinds += [("DLPack only", DLPackOnly), ("DLPack only, legacy capsule", LegacyDLPack),
                  ("CUDA array interface over host memory", CUDAArrayInterfaceOnly)]
    if typecode in ARRAY_TYPECODES:
        kinds.append(("array.array", lambda a: array.array(typecode, a.tolist())))
    return kinds


def _values(buf, dtype):
    """The values a buffer holds in memory order, as numpy."""
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    if isinstance(buf, (DLPackOnly, CUDAArrayInterfaceOnly)):
        buf = buf._array
    return np.asarray(buf).ravel(order="K").view(dtype)


def _expected(comm, send, op, typecode):
    if reduces(send.dtype, ringtree.ops.parse_op(op)):
        out = np.empty_like(send)
        comm.Allreduce(send, out, op)
        return out
    everyone = np.array(comm.allgather(send))  # float16: MPI has no reduction of it
    reduce = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[ringtree.ops.parse_op(op).value]
    return reduce.reduce(everyone, axis=0).astype(send.dtype)


def _calls(rt, sendbuf, recvbuf, op, how):
    """One call of the kind `how`, as a user of mpi4py's methods writes it."""
    if how == "blocking":
        rt.Allreduce(sendbuf, recvbuf, op)
    elif how == "nonblocking":
        request = rt.Iallreduce(sendbuf, recvbuf, op)
        request.Wait(MPI.Status())
    else:
        request = rt.Allreduce_init(sendbuf, recvbuf, op)
        request.Start()
        request.Wait()
        request.Free()


@pytest.mark.parametrize("typecode", NUMPY_TYPECODES)
@pytest.mark.parametrize("how", ["blocking", "nonblocking", "persistent"])
def test_every_kind_of_buffer_typecode_and_op_gives_mpis_result(comm, typecode, how):
    rt = ringtree.Communicator(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for name, op in OPS.items():
        if np.dtype(typecode).kind == "c" and name in ("MAX", "MIN"):
            continue  # not defined on complex numbers, in MPI as in ringtree
        send = _inputs(name, typecode, rank, size)
        expected = _expected(comm, send, op, typecode)
        for kind, make in _kinds(typecode):
            want = _values(make(expected.copy()), send.dtype)
            for mode in ("out of place", "None", "IN_PLACE", "the same buffer twice"):
                sendbuf = make(send.copy())
                recvbuf = make(np.zeros_like(send)) if mode == "out of place" else sendbuf
                if mode == "None":
                    sendbuf = None
                elif mode == "IN_PLACE":
                    sendbuf = MPI.IN_PLACE
                _calls(rt, sendbuf, recvbuf, op, how)
                got = _values(recvbuf, send.dtype)
                if not np.array_equal(got, want) or not same_on_all_ranks(comm, got):
                    failures.append(f"{kind}, {name}, {mode}: got {got[:4]}..., MPI gives {want[:4]}...")
    assert_everywhere(comm, failures)


def test_what_ringtree_does_not_reduce_goes_to_mpis_own_allreduce(comm):
    """A user-defined op and MAXLOC (with its pair datatype) give MPI's own results."""
    rt = ringtree.Communicator(comm)
    rank = comm.Get_rank()
    bigger = MPI.Op.Create(lambda a, b, t: np.maximum(np.frombuffer(a, np.float64), np.frombuffer(b, np.float64),
                                                      out=np.frombuffer(b, np.float64)), commute=True)
    failures = []
    try:
        data = np.arange(5, dtype=np.float64) * (rank + 1)
        out = np.zeros(5)
        rt.Allreduce(data, out, bigger)
        if not np.array_equal(out, np.arange(5) * comm.Get_size()):
            failures.append(f"user op: {out}")
        request = rt.Iallreduce(data, out, bigger)
        request.Wait()
        persistent = rt.Allreduce_init(data, out, bigger)
        persistent.Start()
        persistent.Wait()
        persistent.Free()
        if not np.array_equal(out, np.arange(5) * comm.Get_size()):
            failures.append(f"user op, nonblocking and persistent: {out}")
        if not np.array_equal(ringtree.allreduce(data, op=bigger, comm=comm), out):
            failures.append("user op through the functional API")
    finally:
        bigger.Free()
    pairs = np.array([(float(rank % 2), rank)], dtype=np.dtype([("value", "f8"), ("rank", "i4")], align=True))
    native, ours = np.empty_like(pairs), np.empty_like(pairs)
    comm.Allreduce([pairs, MPI.DOUBLE_INT], [native, MPI.DOUBLE_INT], MPI.MAXLOC)
    rt.Allreduce([pairs, MPI.DOUBLE_INT], [ours, MPI.DOUBLE_INT], MPI.MAXLOC)
    if ours["value"] != native["value"] or ours["rank"] != native["rank"]:  # the fields: not the padding
        failures.append(f"MAXLOC: {ours}, MPI gives {native}")
    assert_everywhere(comm, failures)


def test_communicator_is_an_mpi_intracomm_and_what_it_makes_is_wrapped(comm):
    rt = ringtree.Communicator(comm, timeout=30)
    made = {"Dup": rt.Dup(), "Clone": rt.Clone(), "Split": rt.Split(0, comm.Get_rank()),
            "Create": rt.Create(comm.Get_group()), "Create_group": rt.Create_group(comm.Get_group()),
            "Split_type": rt.Split_type(MPI.COMM_TYPE_SHARED)}
    failures = [] if isinstance(rt, MPI.Intracomm) and rt == comm else ["not an MPI.Intracomm of comm"]
    for name, new in made.items():
        if type(new) is not ringtree.Communicator or new.timeout != 30:
            failures.append(f"{name} gave {type(new).__name__} with timeout {getattr(new, 'timeout', None)}")
        data = np.full(3, comm.Get_rank(), np.int64)
        new.Allreduce(MPI.IN_PLACE, data)
        if not (data == sum(range(new.Get_size()))).all():
            failures.append(f"{name}: allreduce gave {data}")
    wrapped_again = ringtree.Communicator(rt)  # mpi4py takes it as a communicator: wrapping it is too
    if wrapped_again != comm:
        failures.append("Communicator(Communicator(comm)) is another communicator")
    for new in made.values():
        new.Free()
    assert_everywhere(comm, failures)


def test_a_persistent_allreduce_runs_again_at_every_start(comm):
    rank = comm.Get_rank()
    data = np.zeros(8, np.int32)
    out = np.empty_like(data)
    request = ringtree.allreduce_init(data, out, MPI.SUM, comm=comm)
    failures = []
    for step in range(5):
        data[:] = rank + step
        request.Start()
        while not request.Test():
            pass
        if not (out == sum(r + step for r in range(comm.Get_size()))).all():
            failures.append(f"start {step}: {out}")
    request.Free()
    if request:
        failures.append("a freed request is still true")
    with pytest.raises(ValueError, match="Start after Free"):
        request.Start()
    assert_everywhere(comm, failures)


def test_communicators_requests_are_mpi4py_requests_that_mpis_waitall_waitany_and_testall_take(comm):
    rt = ringtree.Communicator(comm)
    rank, total = comm.Get_rank(), sum(range(comm.Get_size()))
    buffers = [np.full(n, rank, np.float64) for n in (1, 1000, 300_000)]
    theirs = np.zeros(4)
    requests = [rt.Iallreduce(MPI.IN_PLACE, b) for b in buffers] + [comm.Iallreduce(np.ones(4), theirs)]
    statuses = [MPI.Status() for _ in requests]
    MPI.Request.Waitall(requests, statuses)  # inside MPI: the progress thread moves ringtree's
    failures = [] if all((b == total).all() for b in buffers) and (theirs == comm.Get_size()).all() \
        else ["Waitall: wrong results"]
    if not all(isinstance(r, MPI.Request) and r == MPI.REQUEST_NULL for r in requests):
        failures.append("Waitall left a request that is not REQUEST_NULL")
    if any((s.source, s.tag, s.error) != (MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.SUCCESS) for s in statuses[:3]):
        failures.append(f"not MPI's empty status: {[(s.source, s.tag, s.error) for s in statuses]}")
    request = rt.Iallreduce(MPI.IN_PLACE, buffers[1])
    if MPI.Request.Waitany([request]) != 0 or not (buffers[1] == total * comm.Get_size()).all():
        failures.append("Waitany")
    request = rt.Iallreduce(MPI.IN_PLACE, buffers[0])
    while not MPI.Request.Testall([request]):
        pass
    request = rt.Iallreduce(MPI.IN_PLACE, buffers[2])
    while not request.Test():  # its own Test and Wait, as mpi4py's
        pass
    if not request.Wait() or not (buffers[2] == total * comm.Get_size()).all():
        failures.append("Test and Wait")
    assert_everywhere(comm, failures)


def test_a_mismatch_in_a_request_waited_for_inside_mpi_is_an_mpi_error_on_every_rank_not_a_hang(comm, capsys, caplog):
    if comm.Get_size() == 1:
        pytest.skip("a mismatch needs two ranks")
    rt = ringtree.Communicator(comm.Dup())  # left unusable by the mismatch
    data = np.ones(1000 + (comm.Get_rank() == 0))
    request = rt.Iallreduce(MPI.IN_PLACE, data, algorithm="ring")
    try:
        MPI.Request.Waitall([request])
        failures = ["Waitall returned"]
    except MPI.Exception as error:
        failures = [] if error.Get_error_class() == MPI.ERR_IN_STATUS else [f"MPI error {error}"]
    logged = [record.getMessage() for record in caplog.records if "disagree at call" in record.getMessage()]
    said = capsys.readouterr().err
    if "Traceback" in said or len(logged) != 1:  # ringtree's error, logged once; no traceback of mpi4py's callback
        failures.append(f"logged {logged}; stderr: {said}")
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("kind", [CUDAArrayInterfaceOnly, DLPackOnly])
def test_a_read_only_export_as_recvbuf_is_refused_before_any_message_as_mpi4py_refuses_it(comm, kind):
    data = np.ones(4)
    result = np.arange(4.0)
    result.setflags(write=False)
    with pytest.raises(BufferError):
        comm.Allreduce(data, kind(result))
    with pytest.raises(ValueError, match=f"rank {comm.Get_rank()}: recvbuf is read-only"):
        ringtree.Communicator(comm).Allreduce(kind(data), kind(result))
    assert_everywhere(comm, [] if (data == 1).all() and (result == np.arange(4.0)).all() else ["a buffer changed"])


def test_a_mismatch_the_progress_thread_found_is_raised_by_the_requests_own_wait_on_every_rank(comm):
    import time

    if comm.Get_size() == 1:
        pytest.skip("a mismatch needs two ranks")
    rt = ringtree.Communicator(comm.Dup())  # left unusable by the mismatch
    request = rt.Iallreduce(MPI.IN_PLACE, np.ones(1000 + (comm.Get_rank() == 0)), algorithm="ring")
    time.sleep(0.5)  # the progress thread meets the mismatch first, most times
    try:
        request.Wait()
        failures = ["Wait returned"]
    except ringtree.MismatchError:
        failures = []
    except Exception as error:  # noqa: BLE001 - what else it raised is the failure
        failures = [f"{type(error).__name__}: {error}"]
    assert_everywhere(comm, failures)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("kind", [MPI.SUM, MPI.MAX, ringtree.ops.ReduceOp.AVG])
def test_a_persistent_allreduce_that_settles_on_mpis_own_binds_its_persistent_request_and_stays_right(comm, kind,
                                                                                                       in_place):
    from ringtree.runtime.session.state import existing_state

    private = comm.Dup()  # a state of its own: the shapes its calls settle on are this test's
    rank, size = private.Get_rank(), private.Get_size()
    data, out = np.zeros(8, np.float64), np.zeros(8, np.float64)
    request = ringtree.allreduce_init(MPI.IN_PLACE if in_place else data, out if in_place else out, kind,
                                      comm=private)
    failures = []
    for step in range(150):  # past online tuning's trials of the shape
        values = np.arange(8) * (rank + 1) + step
        (out if in_place else data)[:] = values
        request.Start()
        request.Wait()
        expected = np.empty(8)
        private.Allreduce(values.astype(np.float64), expected, MPI.SUM if kind is ringtree.ops.ReduceOp.AVG else kind)
        if kind is ringtree.ops.ReduceOp.AVG:
            expected /= size
        if not np.array_equal(out, expected):
            failures.append(f"start {step}: {out} != {expected}")
            break
    shapes = existing_state(private).shapes
    settled = [seen[0].plan for key, seen in shapes.items()  # keys laid out as shapes.shape_key makes them
               if key[0] == "allreduce" and key[2] == id(private) and key[9] == 8 and key[10] == np.float64]
    native = bool(settled) and all(plan.native is not None for plan in settled)
    if native != (request._bound is not None):
        failures.append(f"bound {request._bound is not None}, but the shape's settled plans are {settled}")
    request.Free()
    assert_everywhere(comm, failures)
    private.Free()


def test_a_bound_persistent_allreduce_that_meets_another_call_raises_a_mismatch_on_every_rank(comm):
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to differ")
    private = comm.Dup()
    data, out = np.ones(8), np.empty(8)
    request = ringtree.allreduce_init(data, out, comm=private)
    for _ in range(150):  # past online tuning's trials of the shape
        request.Start()
        request.Wait()
    failures = []
    try:
        if comm.Get_rank() == 0:
            request.Start()
            request.Wait()
        else:
            ringtree.allreduce(np.ones(100), comm=private)
        failures.append("no error")
    except ringtree.MismatchError as error:
        if f"on rank {comm.Get_rank()}" not in str(error) or "count: 8 on rank 0" not in str(error):
            failures.append(str(error))
    assert_everywhere(comm, failures)
