"""CuPy arrays through the same schedules: on a GPU, against native MPI's Allreduce of the same data
on the host, on every rank, for every op and dtype; without a GPU, a clear error.

The path is the one this process takes: between ranks of one node CUDA IPC, to others staged
through pinned host memory unless the MPI is CUDA-aware, direct otherwise; RINGTREE_TRANSPORT
(auto, ipc, direct, staged) and RINGTREE_CUDA_AWARE=0 or 1 force one (scripts/gpu-check runs
IPC and staged, and direct where the MPI allows). Staged calls without IPC peers up to
RINGTREE_GPU_HOST_MAX bytes reduce a host copy of the whole array; the tests run small calls
both ways."""

import hashlib
import os

import numpy as np
import pytest
from mpi4py import MPI
from test_allreduce import ALGORITHMS, DTYPES, NATIVE, OPS, _native_result, _wire, exact_inputs, supported
from test_collectives import ALGORITHMS as OTHER_ALGORITHMS
from test_collectives import failures_on

from conftest import assert_everywhere, ipc_failures, value_bits
from ringtree import settings
from ringtree.allreduce import allreduce, iallreduce
from ringtree.ops import ReduceOp
from ringtree.runtime.session.state import comm_state
from ringtree.runtime.transports.backend import cupy_backend
from ringtree.runtime.transports.choice import transport_for
from ringtree.runtime.transports.cuda import cuda_support

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")


def _device_count() -> tuple[int, str]:
    try:
        return cupy.cuda.runtime.getDeviceCount(), ""
    except cupy.cuda.runtime.CUDARuntimeError as error:
        return 0, str(error)


DEVICES, WHY_NONE = _device_count()
needs_gpu = pytest.mark.skipif(DEVICES == 0, reason=f"no CUDA device ({WHY_NONE or 'none found'}): "
                                                    "the GPU tests run on a machine with one (scripts/gpu-check)")
# CuPy has no long double types.
GPU_DTYPES = [dtype for dtype in DTYPES if dtype.char not in "gG"]


# Staged calls of small arrays: through a host copy of the whole array (the default up to 16 MiB), or
# staged message by message like large ones ("0").
small_calls = pytest.mark.parametrize("host_max", ["default", "0"], ids=["through-host", "per-message"])


def _small_calls(monkeypatch, host_max):
    """RINGTREE_GPU_HOST_MAX=host_max for this test, the other variables as they are."""
    environ = {name: value for name, value in os.environ.items() if name != "RINGTREE_GPU_HOST_MAX"}
    if host_max != "default":
        environ["RINGTREE_GPU_HOST_MAX"] = host_max
    monkeypatch.setattr(settings, "_current", settings.read(environ))


def _on_this_rank_device(comm):
    """Ranks sharing a machine share its GPUs round robin."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    cupy.cuda.Device(local.Get_rank() % DEVICES).use()
    local.Free()


def _check(comm, algorithm, count, cases):
    failures, digests = [], []
    for (op, kind), dtype, inplace in cases:
        data = exact_inputs(kind, dtype, count, comm.Get_rank(), seed=2)
        native = np.empty_like(_wire(data))
        comm.Allreduce(_wire(data), native, NATIVE[kind])
        expected = _native_result(comm, native, kind, dtype)
        device = cupy.asarray(data)
        if inplace:
            result = allreduce(MPI.IN_PLACE, device, op, comm=comm, algorithm=algorithm)
        else:
            result = allreduce(device, op=op, comm=comm, algorithm=algorithm)
            if not np.array_equal(device.get(), data):
                failures.append(f"{kind.value} {dtype}: sendbuf was modified")
        what = f"{algorithm} {count} {kind.value} {dtype} inplace={inplace}"
        if not isinstance(result, cupy.ndarray) or result.dtype != dtype or result.shape != data.shape:
            failures.append(f"{what}: result is {type(result).__name__} {result.dtype}{result.shape}")
            continue
        got = result.get()
        if not np.array_equal(got, expected):
            wrong = np.flatnonzero(got != expected)
            failures.append(f"{what}: {wrong.size} elements differ from native, first at {wrong[:1]}")
        digests.append(hashlib.sha256(value_bits(got)).digest())
    everyone = comm.allgather(digests)
    if any(d != everyone[0] for d in everyone):
        failures.append(f"{algorithm} {count}: ranks disagree")
    return failures


@pytest.mark.mpi
@needs_gpu
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@small_calls
def test_every_op_and_dtype_on_the_gpu(comm, algorithm, host_max, monkeypatch):
    _small_calls(monkeypatch, host_max)
    _on_this_rank_device(comm)
    cases = [(op, dtype, inplace) for op in OPS for dtype in GPU_DTYPES if supported(op[1], dtype)
             for inplace in (False, True)]
    failures = []
    for count in sorted({0, 1, comm.Get_size() + 1, 61}):
        failures += _check(comm, algorithm, count, cases)
    assert_everywhere(comm, failures)


@pytest.mark.mpi
@needs_gpu
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_segmented_messages_on_the_gpu(comm, algorithm):
    # 2**22 + 3 elements: segmented by the pipeline, so staging reuses its host slots many times.
    _on_this_rank_device(comm)
    sums = [((MPI.SUM, ReduceOp.SUM), np.dtype(t), i % 2 == 1) for i, t in enumerate(("float32", "int64", "float64"))]
    assert_everywhere(comm, _check(comm, algorithm, (1 << 22) + 3, sums + [(("avg", ReduceOp.AVG), np.dtype("float64"),
                                                                            False)]))


@pytest.mark.mpi
@needs_gpu
@pytest.mark.parametrize("name, algorithm", [(name, algorithm) for name, algorithms in OTHER_ALGORITHMS.items()
                                             for algorithm in algorithms])
@pytest.mark.parametrize("segment", [None, 64])
def test_the_other_collectives_on_the_gpu(comm, name, algorithm, segment):
    # CuPy arrays in and out, against MPI's own on host copies: every root, uneven blocks with zeros,
    # whole and (64-byte segments) staged message by message.
    _on_this_rank_device(comm)
    assert_everywhere(comm, failures_on(comm, name, algorithm, segment, cupy.asarray, cupy.asnumpy))


@pytest.mark.mpi
@needs_gpu
def test_the_path_follows_the_mpi_and_the_setting(comm):
    _on_this_rank_device(comm)
    forced = {"staged": True, "direct": False}.get(settings.current().transport)
    assert cupy_backend().staged == (not cuda_support().aware if forced is None else forced)


@pytest.mark.mpi
@needs_gpu
def test_ranks_of_one_node_move_device_memory_by_ipc(comm):
    # Unless RINGTREE_TRANSPORT says otherwise; every rank here is on one node.
    _on_this_rank_device(comm)
    mine = comm.Dup()
    x = cupy.arange(1 << 20, dtype=cupy.float32) + comm.rank
    got = allreduce(x, comm=mine, algorithm="ring")
    n = comm.size
    failures = [] if cupy.array_equal(got, cupy.arange(1 << 20, dtype=cupy.float32) * n + n * (n - 1) // 2) else ["wrong"]
    by_ipc = settings.current().transport not in ("staged", "direct")
    failures += ipc_failures(transport_for(comm_state(mine), cupy_backend()),
                             set(range(n)) - {comm.rank} if by_ipc else [])
    mine.Free()
    assert_everywhere(comm, failures)


@pytest.mark.mpi
@needs_gpu
@small_calls
def test_small_staged_calls_go_through_a_host_copy_up_to_the_limit(comm, host_max, monkeypatch):
    _small_calls(monkeypatch, host_max)
    _on_this_rank_device(comm)
    # A size no other test uses: whether a plan for device arrays of it exists says which way it went.
    x = allreduce(cupy.ones(1237, cupy.int16), comm=comm)
    planned = any(key[0] is cupy_backend() and key[2] == 1237 for key in comm_state(comm).plans)
    through_host = (cupy_backend().staged and host_max == "default"
                    and transport_for(comm_state(comm), cupy_backend()) is None)
    failures = [] if planned != through_host else [f"device plan: {planned}, through the host expected: {through_host}"]
    if not cupy.array_equal(x, cupy.full(1237, comm.Get_size(), cupy.int16)):
        failures.append("wrong sum")
    assert_everywhere(comm, failures)


@pytest.mark.mpi
@needs_gpu
# float64: 8 KB and 8 MiB go through a host copy, 32 MiB message by message.
@pytest.mark.parametrize("count", [1000, 1 << 20, 1 << 22], ids=["8KB", "8MiB", "32MiB"])
def test_stream_order_is_kept(comm, count):
    # Work queued on the caller's stream just before the call is what the call reduces, and work queued
    # on it after the call sees the result, though the call is waited for under another stream.
    _on_this_rank_device(comm)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.zeros(count, cupy.float64)  # every partial sum an exact integer
        x += comm.Get_rank() + 1  # queued, perhaps not run, when the call starts
        request = iallreduce(MPI.IN_PLACE, x, "avg", comm=comm)
    request.wait()  # its last ops, avg's division among them, are issued here
    with stream:
        total = float((x * 2).sum())
    n = comm.Get_size()
    assert_everywhere(comm, [] if total == (n + 1) * count else [f"sum {total}"])


@pytest.mark.mpi
@needs_gpu
def test_bad_device_arrays_are_refused_before_any_message(comm):
    _on_this_rank_device(comm)
    rank = comm.Get_rank()
    x = cupy.arange(20, dtype=cupy.float32)
    cases = [
        (lambda: allreduce(x, np.zeros(20, np.float32), comm=comm), TypeError,
         "sendbuf is a cupy.ndarray but recvbuf is a numpy.ndarray"),
        (lambda: allreduce(x[::2], comm=comm), ValueError, "sendbuf is not C-contiguous"),
        (lambda: allreduce(x, cupy.zeros(20, cupy.float64), comm=comm), TypeError, "recvbuf has dtype float64"),
        (lambda: allreduce(x[:10], x[5:15], comm=comm), ValueError, "overlap"),
        (lambda: allreduce(x, op=MPI.BAND, comm=comm), TypeError, "op band is not defined for dtype float32"),
    ]
    failures = []
    for call, error, text in cases:
        try:
            call()
            failures.append(f"no error for {text}")
        except error as raised:
            if f"ringtree allreduce on rank {rank}: " not in str(raised) or text not in str(raised):
                failures.append(f"{text!r} not in {raised}")
    if not cupy.array_equal(x, cupy.arange(20, dtype=cupy.float32)):
        failures.append("x was modified")
    if DEVICES > 1:
        with cupy.cuda.Device((x.device.id + 1) % DEVICES):
            try:
                allreduce(x, comm=comm)
                failures.append("no error for an array on another device")
            except ValueError as raised:
                if "but the current device is" not in str(raised):
                    failures.append(str(raised))
    assert_everywhere(comm, failures)


@pytest.mark.skipif(DEVICES > 0, reason="a CUDA device is present")
def test_cupy_arrays_without_a_gpu_get_a_clear_error():
    # Without a GPU CuPy cannot allocate, but an array over memory it does not own can exist.
    host = np.arange(4, dtype=np.float32)
    memory = cupy.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0)
    array = cupy.ndarray(host.shape, host.dtype, cupy.cuda.MemoryPointer(memory, 0))
    rank = MPI.COMM_WORLD.Get_rank()
    with pytest.raises(RuntimeError, match=rf"ringtree allreduce on rank {rank}: the arrays are CuPy arrays, "
                                           r"but CUDA finds no usable device \(cuda"):
        allreduce(array)
    with pytest.raises(RuntimeError, match="finds no usable device"):
        allreduce(MPI.IN_PLACE, array, "max")
    assert np.array_equal(host, np.arange(4, dtype=np.float32))
