"""Data-parallel training of a small MLP on scikit-learn's digits, with ringtree's fused, overlapped allreduce.

    mpiexec -n 4 python examples/train.py [--epochs 30] [--batch-size 64] [--bucket-mb 25] ...

Every rank holds the same model and trains on its own share of each global
batch; the gradients are averaged with ringtree.GradientBucketer while the
backward pass goes on, and every rank applies the same update. Rank 0 shows a
progress bar and, after each epoch, the loss, train and test accuracy,
examples per second and the share of step time spent in communication
(packing, starting and waiting for the gradient allreduces). At the end every rank checks that all ranks hold bitwise the
same parameters.

With --shard-optimizer (ZeRO stage 1) each rank keeps the optimizer state of one shard of the
parameters only: after the backward pass the gradients are reduce-scattered (each rank gets the
average of its shard), each rank updates its shard of the parameters and of the momentum, and
an allgather gives every rank every shard again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

# One BLAS thread per rank: the ranks already use the cores, and more threads only contend.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ringtree  # noqa: E402


def training_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a training run, shared with examples/train_torch.py."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, split evenly across ranks")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=128, help="width of the two hidden layers")
    parser.add_argument("--target-accuracy", type=float, default=None,
                        help="exit with an error unless the final test accuracy reaches this (0-1)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = training_arguments(__doc__)
    parser.add_argument("--algorithm", default="auto", help="ringtree allreduce algorithm")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="gradient fusion bucket size in MiB; 0: one allreduce per array")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="numpy, or CuPy on the GPU")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (smoke runs)")
    parser.add_argument("--shard-optimizer", action="store_true",
                        help="ZeRO stage 1: reduce-scatter the gradients, update a shard each, allgather the parameters")
    return parser.parse_args(argv)


def array_module(device: str):
    if device == "cpu":
        return np
    import cupy
    return cupy


def load_digits_split(seed: int):
    """scikit-learn's bundled 8x8 digits (no download), scaled to [0, 1]; 80 % train, 20 % test."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    return train_test_split((x / 16.0).astype(np.float32), y, test_size=0.2, random_state=seed, stratify=y)


class MLP:
    """Fully connected layers with ReLU between them and softmax cross-entropy on top."""

    def __init__(self, sizes: list[int], seed: int, xp) -> None:
        rng = np.random.default_rng(seed)
        self.xp = xp
        self.params = []
        for fan_in, fan_out in zip(sizes, sizes[1:]):
            weight = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)  # He initialisation
            self.params += [xp.asarray(weight, dtype=xp.float32), xp.zeros(fan_out, dtype=xp.float32)]
        self.grads = [xp.zeros_like(p) for p in self.params]
        self.velocity = [xp.zeros_like(p) for p in self.params]

    def logits(self, x):
        activations = [x]
        for layer in range(0, len(self.params), 2):
            z = activations[-1] @ self.params[layer] + self.params[layer + 1]
            activations.append(self.xp.maximum(z, 0) if layer + 2 < len(self.params) else z)
        return activations

    def loss_and_backward(self, x, y, on_gradient=lambda index: None) -> float:
        """Mean cross-entropy over (x, y); fills self.grads, last layer first, calling
        on_gradient(i) as soon as gradient i is final."""
        xp = self.xp
        activations = self.logits(x)
        logits = activations[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        probabilities = xp.exp(shifted)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        rows = xp.arange(len(y))
        loss = float(-xp.log(probabilities[rows, y] + 1e-12).mean())
        delta = probabilities
        delta[rows, y] -= 1
        delta /= len(y)
        for layer in reversed(range(0, len(self.params), 2)):
            inputs = activations[layer // 2]
            self.grads[layer + 1][...] = delta.sum(axis=0)
            on_gradient(layer + 1)
            self.grads[layer][...] = inputs.T @ delta
            on_gradient(layer)
            if layer:
                delta = (delta @ self.params[layer].T) * (inputs > 0)
        return loss

    def step(self, lr: float, momentum: float = 0.9) -> None:
        for p, g, v in zip(self.params, self.grads, self.velocity):
            v *= momentum
            v += g
            p -= lr * v

    def accuracy(self, x, y) -> float:
        return float((self.logits(x)[-1].argmax(axis=1) == y).mean())


class ShardedSGD:
    """Momentum SGD with its state sharded across the ranks (ZeRO stage 1).

    The model's parameters and gradients become views of one flat array each; rank r owns elements
    [start, start + count) of them, and keeps the momentum of those only.
    """

    def __init__(self, model: MLP, comm: MPI.Comm) -> None:
        xp, self.comm, self.model = model.xp, comm, model
        self.parameters = _flattened(model.params, xp)
        self.gradients = _flattened(model.grads, xp)
        model.params = _views(self.parameters, model.params)
        model.grads = _views(self.gradients, model.grads)
        model.velocity = None  # the whole model's momentum is what sharding saves
        total, size = self.parameters.size, comm.Get_size()
        self.counts = [total * (r + 1) // size - total * r // size for r in range(size)]
        self.start = total * comm.Get_rank() // size
        self.shard = self.parameters[self.start:self.start + self.counts[comm.Get_rank()]]
        self.gradient_shard = xp.empty_like(self.shard)
        self.velocity = xp.zeros_like(self.shard)
        self.communication_seconds = 0.0

    def step(self, lr: float, momentum: float = 0.9) -> None:
        started = time.perf_counter()
        ringtree.reduce_scatter(self.gradients, self.gradient_shard, self.counts, op="avg", comm=self.comm)
        self.communication_seconds += time.perf_counter() - started
        self.velocity *= momentum
        self.velocity += self.gradient_shard
        self.shard -= lr * self.velocity
        started = time.perf_counter()
        ringtree.allgather(MPI.IN_PLACE, self.parameters, self.counts, comm=self.comm)
        self.communication_seconds += time.perf_counter() - started


def _flattened(arrays, xp):
    flat = xp.empty(sum(a.size for a in arrays), dtype=arrays[0].dtype)
    offset = 0
    for a in arrays:
        flat[offset:offset + a.size] = a.reshape(-1)
        offset += a.size
    return flat


def _views(flat, arrays):
    views, offset = [], 0
    for a in arrays:
        views.append(flat[offset:offset + a.size].reshape(a.shape))
        offset += a.size
    return views


def train(args: argparse.Namespace, comm: MPI.Comm, verbose: bool = True) -> dict:
    """Train as `args` says on `comm`; return the model and what happened."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the {size} ranks")
    xp = array_module(args.device)
    x_train, x_test, y_train, y_test = load_digits_split(args.seed)
    x_train, x_test, y_train, y_test = map(xp.asarray, (x_train, x_test, y_train, y_test))
    model = MLP([x_train.shape[1], args.hidden, args.hidden, 10], args.seed, xp)
    show = verbose and rank == 0
    if args.shard_optimizer:
        optimizer = ShardedSGD(model, comm)
        step, on_gradient, finish_gradients = optimizer.step, lambda index: None, lambda: None
        communicated = lambda: optimizer.communication_seconds  # noqa: E731
        if show:
            whole = optimizer.parameters.nbytes
            print(f"training on {size} ranks with the optimizer sharded: {optimizer.parameters.size:,} parameters; "
                  f"momentum {optimizer.velocity.nbytes / 1024:.1f} KiB per rank, 1/{size} of the "
                  f"{whole / 1024:.1f} KiB unsharded", flush=True)
    else:
        bucketer = ringtree.GradientBucketer(model.grads, bucket_bytes=int(args.bucket_mb * 2**20), op="avg",
                                             comm=comm, algorithm=args.algorithm)
        step, on_gradient, finish_gradients = model.step, bucketer.mark_ready, bucketer.wait
        communicated = lambda: bucketer.communication_seconds  # noqa: E731
        if show:
            print(f"training on {size} ranks: {len(y_train)} train / {len(y_test)} test digits, "
                  f"global batch {args.batch_size}, {sum(p.size for p in model.params):,} parameters in "
                  f"{len(bucketer.buckets)} bucket(s) of {', '.join(f'{b / 1024:.0f} KiB' for b in bucketer.sizes)}",
                  flush=True)

    steps_per_epoch = len(y_train) // args.batch_size  # the last, partial batch is dropped
    history, steps = [], 0
    for epoch in range(args.epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(len(y_train))
        communicated_before = communicated()
        start = time.perf_counter()
        losses = []
        for k in _progress(range(steps_per_epoch), show, f"epoch {epoch + 1}/{args.epochs}"):
            batch = order[k * args.batch_size:(k + 1) * args.batch_size]
            mine = xp.asarray(batch[rank::size])  # this rank's share of the global batch
            losses.append(model.loss_and_backward(x_train[mine], y_train[mine], on_gradient))
            finish_gradients()  # unsharded: the gradients now hold the average over the global batch
            step(args.lr)
            steps += 1
            if args.max_steps and steps >= args.max_steps:
                break
        seconds = time.perf_counter() - start
        record = {
            "epoch": epoch + 1,
            "loss": float(np.mean(losses)),
            "train_accuracy": model.accuracy(x_train, y_train),
            "test_accuracy": model.accuracy(x_test, y_test),
            "examples_per_second": len(losses) * args.batch_size / seconds,
            "communication_share": (communicated() - communicated_before) / seconds,
        }
        history.append(record)
        if show:
            print(f"epoch {record['epoch']:>3}: loss {record['loss']:.4f}  train {record['train_accuracy']:.2%}  "
                  f"test {record['test_accuracy']:.2%}  {record['examples_per_second']:,.0f} examples/s  "
                  f"communication {record['communication_share']:.1%} of step time", flush=True)
        if args.max_steps and steps >= args.max_steps:
            break
    return {"model": model, "history": history, "identical": parameters_identical(model, comm),
            "optimizer": optimizer if args.shard_optimizer else None}


def parameters_identical(model: MLP, comm: MPI.Comm) -> bool:
    digest = hashlib.sha256()
    for p in model.params:
        digest.update(np.ascontiguousarray(model.xp.asnumpy(p) if model.xp is not np else p).tobytes())
    return len(set(comm.allgather(digest.hexdigest()))) == 1


def _progress(steps, show: bool, description: str):
    if not show:
        return steps
    from tqdm import tqdm
    return tqdm(steps, desc=description, leave=False, unit="step")


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    report(train(args, comm), comm, args.target_accuracy)


def report(result: dict, comm: MPI.Comm, target_accuracy: float | None) -> None:
    """Say whether every rank ended with the same parameters, and the final test accuracy; exit with
    an error unless they did and it reaches `target_accuracy`."""
    final = result["history"][-1]
    if comm.Get_rank() == 0:
        print(f"parameters are {'bitwise identical' if result['identical'] else 'NOT identical'} "
              f"on all {comm.Get_size()} ranks; final test accuracy {final['test_accuracy']:.2%}")
    if not result["identical"]:
        raise SystemExit("ranks ended with different parameters")
    if target_accuracy is not None and final["test_accuracy"] < target_accuracy:
        raise SystemExit(f"test accuracy {final['test_accuracy']:.2%} is below the target {target_accuracy:.0%}")


if __name__ == "__main__":
    main()
