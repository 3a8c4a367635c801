"""The staging pass (device buffers through host slots), checked without MPI and, under mpiexec,
run by the engine against native MPI."""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from ringtree.algorithms import ALGORITHMS
from ringtree.api.request import Request
from ringtree.ops import ReduceOp
from ringtree.runtime.safety.mismatch import signature
from ringtree.runtime.session.plan import build_plan
from ringtree.runtime.session.state import comm_state
from ringtree.runtime.transports.backend import NumpyBackend
from ringtree.schedule import OpKind
from ringtree.schedule.ir import ALLREDUCE
from ringtree.schedule.pipeline import segmented
from ringtree.schedule.staging import RECV_SLOTS, SEND_SLOTS, is_host, staged
from ringtree.sim.verify import allreduce_schedules, verify_schedules
from ringtree.tuning.selector import select


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(sorted(ALGORITHMS)), nranks=st.integers(1, 9), count=st.integers(0, 200),
       segment=st.integers(0, 64), window=st.integers(1, 5))
def test_staging_keeps_the_collective_and_bounds_host_memory(algorithm, nranks, count, segment, window):
    plain = allreduce_schedules(algorithm, nranks, count)
    if segment:
        plain = [segmented(s, segment, 4) for s in plain]
    through_host = [staged(s, window) for s in plain]
    verify_schedules(through_host, stepwise=not segment)
    for before, after in zip(plain, through_host):
        messages = [op for op in after.ops if op.peer is not None]
        assert all(is_host(op.regions[0].buffer) for op in messages)
        assert not any(is_host(ref.buffer) for op in after.ops if op.peer is None for ref in op.regions[:-1]
                       if op.kind is OpKind.REDUCE)  # reductions stay on the device
        assert [(op.kind, op.peer, op.regions[0].count) for op in messages] == \
            [(op.kind, op.peer, op.regions[0].count) for op in before.ops if op.peer is not None]
        largest = max((op.regions[0].count for op in messages), default=0)
        for kind, name in ((OpKind.SEND, SEND_SLOTS), (OpKind.RECV, RECV_SLOTS)):
            peers = {op.peer for op in messages if op.kind is kind}
            assert dict(after.scratch).get(name, 0) == len(peers) * window * largest


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_staged_schedules_verify_on_1_to_16_ranks(algorithm):
    for nranks in range(1, 17):
        count = 2 * nranks + 1
        verify_schedules([staged(s, 2) for s in allreduce_schedules(algorithm, nranks, count)])
        verify_schedules([staged(segmented(s, 2, 4), 1) for s in allreduce_schedules(algorithm, nranks, count)],
                         stepwise=False)


def test_staging_rejects_nonsense():
    with pytest.raises(ValueError, match="must be positive"):
        staged(allreduce_schedules("ring", 2, 10)[0], 0)


_WORKER = ThreadPoolExecutor(1)  # one thread runs the queued work in order, as a CUDA stream does


class _Queued:
    def __init__(self, future):
        self.future = future

    @property
    def done(self) -> bool:
        return self.future.done()


def _later(work, *args):
    def run():
        time.sleep(2e-4)  # long enough that anything started before the work finished reads stale data
        work(*args)
    return _Queued(_WORKER.submit(run))


class _QueuedNumpy(NumpyBackend):
    """Reductions and copies that return before they have run, as CuPy's do: the engine must start
    what depends on them only once they are done."""

    asynchronous = True

    @staticmethod
    def reducer(op):
        ufunc = NumpyBackend.reducer(op)
        return lambda left, right, out: _later(ufunc, left, right, out)

    @staticmethod
    def copy(dst, src):
        return _later(np.copyto, dst, src)


class _QueuedStagedNumpy(_QueuedNumpy):
    staged = True


@pytest.mark.mpi
@pytest.mark.parametrize("backend, segment, inplace", [(_QueuedStagedNumpy, None, False), (_QueuedStagedNumpy, 256, True),
                                                       (_QueuedNumpy, 256, False)])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_the_engine_runs_staged_and_queued_work_like_native_mpi(backend, segment, inplace, algorithm):
    comm = MPI.COMM_WORLD
    count = 1000 + 7 * comm.Get_size()
    data = np.random.default_rng(comm.Get_rank()).integers(-1000, 1000, count).astype(np.int64)
    expected = np.empty_like(data)
    comm.Allreduce(data, expected, MPI.SUM)
    result = data.copy() if inplace else np.full_like(data, -1)
    source = result if inplace else data
    state = comm_state(comm, None)
    choice = select(result.nbytes, state.size, result.dtype.name, "sum", algorithm, segment)
    call = build_plan(state, backend, choice, ALLREDUCE, result.size, result.dtype, ReduceOp.SUM,
                      signature(result.size, result.dtype, "sum", algorithm, segment), segment, choice.stepwise)
    assert any(is_host(name) for name, _ in call.compiled.schedule.scratch) == (backend.staged and comm.Get_size() > 1)
    Request(call.start(state, source, result, inplace, None), result).wait()
    assert np.array_equal(result, expected)
