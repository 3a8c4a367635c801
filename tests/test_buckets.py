"""GradientBucketer: fused, ordered, overlapped allreduce of many arrays, against native MPI."""

import numpy as np
import pytest

import ringtree
from conftest import assert_everywhere

pytestmark = pytest.mark.mpi

SHAPES = [(7, 3), (3,), (100, 10), (10,), (1,), (2000,), (5, 5)]


def _arrays(comm, step):
    rng = np.random.default_rng([comm.Get_rank(), step])
    arrays = [rng.integers(-50, 50, shape).astype(np.float64) for shape in SHAPES]
    arrays.append(rng.integers(-50, 50, 33).astype(np.int32))  # another dtype: a bucket of its own
    return arrays


def _native_sums(comm, arrays):
    out = []
    for a in arrays:
        total = np.empty_like(a)
        comm.Allreduce(a, total)
        out.append(total)
    return out


@pytest.mark.parametrize("bucket_bytes", [0, 1000, 8192, 1 << 25])
def test_every_array_gets_the_sum_over_ranks_step_after_step(comm, bucket_bytes):
    grads = [np.zeros(shape) for shape in SHAPES] + [np.zeros(33, np.int32)]
    bucketer = ringtree.GradientBucketer(grads, bucket_bytes=bucket_bytes, op="sum", comm=comm)
    failures = []
    for step in range(3):
        values = _arrays(comm, step)
        expected = _native_sums(comm, values)
        order = np.random.default_rng(step).permutation(len(grads))  # any order; buckets still start in order
        for i in order:
            grads[i][...] = values[i]
            bucketer.mark_ready(int(i))
        bucketer.wait()
        failures += [f"step {step} array {i}" for i, (g, e) in enumerate(zip(grads, expected))
                     if not np.array_equal(g, e)]
    assert_everywhere(comm, failures)


def test_buckets_respect_the_size_limit_and_dtype(comm):
    grads = [np.zeros(shape) for shape in SHAPES] + [np.zeros(33, np.int32)]
    bucketer = ringtree.GradientBucketer(grads, bucket_bytes=8192, comm=comm)
    for bucket, size in zip(bucketer.buckets, bucketer.sizes):
        assert len(bucket.members) == 1 or size <= 8192
        assert len({grads[i].dtype for i in bucket.members}) == 1
    # filled from the last array backwards, as a backward pass produces them
    assert bucketer.buckets[0].members[0] == len(grads) - 1
    assert sorted(i for b in bucketer.buckets for i in b.members) == list(range(len(grads)))
    unfused = ringtree.GradientBucketer(grads, bucket_bytes=0, comm=comm)
    assert len(unfused.buckets) == len(grads) and all(b.flat is None for b in unfused.buckets)


def test_average_is_the_default(comm):
    grad = np.full(10, float(comm.Get_rank()))
    bucketer = ringtree.GradientBucketer([grad], comm=comm)
    bucketer.mark_ready(0)
    bucketer.wait()
    assert_everywhere(comm, [] if (grad == (comm.Get_size() - 1) / 2).all() else [f"got {grad}"])


def test_misuse_is_an_error_not_a_hang(comm):
    grads = [np.zeros(4), np.zeros(4)]
    bucketer = ringtree.GradientBucketer(grads, comm=comm)
    with pytest.raises(RuntimeError, match=r"arrays \[0, 1\] were not marked ready"):
        bucketer.wait()
    bucketer.mark_ready(1)
    with pytest.raises(ValueError, match="marked ready twice"):
        bucketer.mark_ready(1)
    bucketer.mark_ready(0)
    bucketer.wait()
    with pytest.raises(ValueError, match="not C-contiguous"):
        ringtree.GradientBucketer([np.zeros(10)[::2]], comm=comm)
