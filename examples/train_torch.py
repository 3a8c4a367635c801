"""Data-parallel training of a small torch MLP on scikit-learn's digits, with DDP or FSDP2 on
torch.distributed's "ringtree" backend, and the same steps on gloo, an epoch of each in turn, for the
throughput ratio.

    mpiexec -n 4 python examples/train_torch.py [--backend ringtree|gloo] [--wrap ddp|fsdp2] ...

`import ringtree.torch` registers the backend; under mpiexec `dist.init_process_group("ringtree")`
needs nothing else (rank and world size from MPI, the rendezvous over MPI). The model trains
unchanged but for the backend's name: DDP without a hook, or FSDP2's `fully_shard` on a device mesh
of the group. The comparison run uses a gloo group of the same ranks. With `--hook`, DDP reduces the
gradients with one of ringtree's DDP communication hooks instead (fp16 and bf16 compress them).
The model, data and split are examples/train.py's. Rank 0 prints, after each epoch, the loss, test
accuracy and examples per second; at the end every rank checks that all ranks hold bitwise the same
parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one thread per rank: the ranks already use the cores

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from train import load_digits_split, report, training_arguments  # noqa: E402  (examples/train.py, beside this file)

import ringtree.torch  # noqa: E402

HOOKS = {"allreduce": ringtree.torch.allreduce_hook, "fp16": ringtree.torch.fp16_compress_hook,
         "bf16": ringtree.torch.bf16_compress_hook}


def parse_args(argv=None) -> argparse.Namespace:
    parser = training_arguments(__doc__)
    parser.add_argument("--backend", choices=["ringtree", "gloo"], default="ringtree",
                        help="torch.distributed's backend for the training run")
    parser.add_argument("--wrap", choices=["ddp", "fsdp2"], default="ddp", help="DDP, or FSDP2's fully_shard")
    parser.add_argument("--hook", choices=sorted(HOOKS), default=None,
                        help="DDP only: reduce the gradients with this ringtree DDP hook")
    parser.add_argument("--bucket-mb", type=float, default=0.025,
                        help="DDP's bucket_cap_mb (the default makes several buckets of this model)")
    parser.add_argument("--no-compare", action="store_true", help="skip the run of the same steps on gloo")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.bucket_mb <= 0:
        parser.error("--epochs, --batch-size and --bucket-mb must be positive")
    if args.hook and args.wrap != "ddp":
        parser.error("--hook is a DDP communication hook: it needs --wrap ddp")
    return args


def wrapped(model, args, group, hook: bool):
    """The model as DDP (with ringtree's `args.hook` where `hook`) or FSDP2 over `group`."""
    if args.wrap == "ddp":
        ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=args.bucket_mb)
        if hook and args.hook:
            ddp.register_comm_hook(ringtree.torch.HookState(MPI.COMM_WORLD), HOOKS[args.hook])
        return ddp
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train(args: argparse.Namespace, comm: MPI.Comm, group, label: str, show: bool, hook: bool):
    """Train with DDP or FSDP2 over `group` (with `--hook` where `hook`), an epoch at each next(); the
    last gives the history and whether every rank holds the same parameters."""
    rank, size = comm.Get_rank(), comm.Get_size()
    x_train, x_test, y_train, y_test = (torch.from_numpy(a) for a in load_digits_split(args.seed))
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(x_train.shape[1], args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10))
    training = wrapped(model, args, group, hook)
    optimizer = torch.optim.SGD(training.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = len(y_train) // args.batch_size
    history = []
    for epoch in range(args.epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(len(y_train))
        start, losses = time.perf_counter(), []
        for step in range(steps_per_epoch):
            mine = torch.from_numpy(order[step * args.batch_size:(step + 1) * args.batch_size][rank::size])
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(training(x_train[mine]), y_train[mine])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        seconds = time.perf_counter() - start
        with torch.no_grad():
            accuracy = float((training(x_test).argmax(dim=1) == y_test).float().mean())
        record = {"epoch": epoch + 1, "loss": float(np.mean(losses)), "test_accuracy": accuracy,
                  "examples_per_second": steps_per_epoch * args.batch_size / seconds}
        history.append(record)
        if show:
            print(f"{label:>8} epoch {record['epoch']:>3}: loss {record['loss']:.4f}  test {accuracy:.2%}  "
                  f"{record['examples_per_second']:,.0f} examples/s", flush=True)
        if epoch + 1 < args.epochs:
            yield None
    whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]  # FSDP2's are sharded
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in whole)).hexdigest()
    yield {"history": history, "identical": len(set(comm.allgather(digest))) == 1}


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    if args.batch_size % comm.Get_size():
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the {comm.Get_size()} ranks")
    show = comm.Get_rank() == 0
    dist.init_process_group(args.backend)  # under mpiexec, nothing else: ringtree.torch's rendezvous over MPI
    how = f"DDP with ringtree.torch.{HOOKS[args.hook].__name__}" if args.hook else args.wrap.upper()
    if show:
        print(f"{how} on {comm.Get_size()} ranks, torch.distributed on {args.backend}", flush=True)
    runs = [train(args, comm, dist.group.WORLD, args.backend, show, hook=True)]
    if not args.no_compare and args.backend != "gloo":
        if show:
            print("and the same steps on gloo, an epoch of each in turn", flush=True)
        runs.append(train(args, comm, dist.new_group(backend="gloo"), "gloo", show, hook=False))
    for _ in range(args.epochs):
        results = [next(run) for run in runs]
    ours = results[0]
    if len(results) == 2 and show:
        theirs = results[1]
        rate = [np.median([r["examples_per_second"] for r in run["history"]]) for run in (ours, theirs)]
        print(f"throughput, median over epochs: {args.backend} {rate[0]:,.0f} examples/s, gloo {rate[1]:,.0f}: "
              f"{rate[0] / rate[1]:.2f}x; final test accuracy {theirs['history'][-1]['test_accuracy']:.2%} "
              "on gloo", flush=True)
    dist.destroy_process_group()
    report(ours, comm, args.target_accuracy)  # of the training run


if __name__ == "__main__":
    main()
