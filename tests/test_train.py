"""examples/train.py: N-rank data-parallel training equals 1-rank training on the same global batches."""

import importlib.util
import pathlib

import numpy as np
import pytest
from mpi4py import MPI

from conftest import assert_everywhere, same_on_all_ranks

pytestmark = pytest.mark.mpi

pytest.importorskip("sklearn", reason="examples/train.py needs scikit-learn (the examples or test extra)")
_spec = importlib.util.spec_from_file_location(
    "train_example", pathlib.Path(__file__).parents[1] / "examples" / "train.py")
train_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_example)


@pytest.mark.parametrize("bucket_mb", ["25", "0"])
def test_n_ranks_train_the_same_model_as_one(comm, bucket_mb):
    size = comm.Get_size()
    args = train_example.parse_args(["--epochs", "1", "--max-steps", "8", "--batch-size", str(8 * size),
                                     "--hidden", "32", "--seed", "3", "--bucket-mb", bucket_mb])
    parallel = train_example.train(args, comm, verbose=False)
    alone = train_example.train(args, MPI.COMM_SELF, verbose=False)
    failures = []
    for i, (p, q) in enumerate(zip(parallel["model"].params, alone["model"].params)):
        if not np.allclose(p, q, rtol=1e-5, atol=1e-6):
            failures.append(f"parameter {i} differs from 1-rank training by {np.abs(p - q).max():.3g}")
        if not same_on_all_ranks(comm, p):
            failures.append(f"parameter {i} differs between ranks")
    if not parallel["identical"]:
        failures.append("train() says the ranks differ")
    moved = any(not np.array_equal(p, q) for p, q in
                zip(parallel["model"].params, train_example.MLP([64, 32, 32, 10], 3, np).params))
    if not moved:
        failures.append("training did not change the parameters")
    assert_everywhere(comm, failures)


def test_a_sharded_optimizer_trains_the_same_model_with_1_over_n_of_the_momentum_each(comm):
    size = comm.Get_size()
    options = ["--epochs", "1", "--max-steps", "8", "--batch-size", str(8 * size), "--hidden", "32", "--seed", "3"]
    sharded = train_example.train(train_example.parse_args([*options, "--shard-optimizer"]), comm, verbose=False)
    whole = train_example.train(train_example.parse_args(options), comm, verbose=False)
    failures = []
    for i, (p, q) in enumerate(zip(sharded["model"].params, whole["model"].params)):
        if not np.allclose(p, q, rtol=1e-5, atol=1e-6):
            failures.append(f"parameter {i} differs from unsharded training by {np.abs(p - q).max():.3g}")
        if not same_on_all_ranks(comm, p):
            failures.append(f"parameter {i} differs between ranks")
    total = sum(p.size for p in whole["model"].params)
    momentum = comm.allgather(sharded["optimizer"].velocity.size)
    if sum(momentum) != total or max(momentum) > total // size + 1:
        failures.append(f"momentum per rank {momentum} is not a 1/{size} share of {total} parameters")
    assert_everywhere(comm, failures)
