"""Data-parallel training of a small torch MLP on scikit-learn's digits with DDP, its gradients averaged
by ringtree's DDP comm hook; then the same steps with DDP's own gloo allreduce, for the throughput ratio.

    mpiexec -n 4 python examples/train_torch.py [--epochs 30] [--hook allreduce|fp16|bf16] ...

torch.distributed runs on gloo, for what DDP does besides the gradients (it broadcasts the
parameters at the start); ringtree.torch.allreduce_hook reduces the gradients over MPI while the
backward pass goes on. The model, data and split are examples/train.py's. Rank 0 prints, after each
epoch, the loss, test accuracy, examples per second and the share of step time spent in the hook;
at the end every rank checks that all ranks hold bitwise the same parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import time

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one thread per rank: the ranks already use the cores

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from train import load_digits_split, report, training_arguments  # noqa: E402  (examples/train.py, beside this file)

import ringtree.torch  # noqa: E402

HOOKS = {"allreduce": ringtree.torch.allreduce_hook, "fp16": ringtree.torch.fp16_compress_hook,
         "bf16": ringtree.torch.bf16_compress_hook}


def parse_args(argv=None) -> argparse.Namespace:
    parser = training_arguments(__doc__)
    parser.add_argument("--hook", choices=sorted(HOOKS), default="allreduce", help="ringtree's DDP comm hook")
    parser.add_argument("--bucket-mb", type=float, default=0.025,
                        help="DDP's bucket_cap_mb (the default makes several buckets of this model)")
    parser.add_argument("--no-compare", action="store_true", help="skip the run with DDP's own gloo allreduce")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.bucket_mb <= 0:
        parser.error("--epochs, --batch-size and --bucket-mb must be positive")
    return args


def init_gloo(comm: MPI.Comm) -> None:
    """torch.distributed on gloo, its rendezvous at a free port on rank 0's host, found over MPI."""
    address = None
    if comm.Get_rank() == 0:
        with socket.socket() as free:
            free.bind(("", 0))
            address = (socket.gethostname(), free.getsockname()[1])
    host, port = comm.bcast(address)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=comm.Get_rank(),
                            world_size=comm.Get_size())


def train(args: argparse.Namespace, comm: MPI.Comm, hook, show: bool) -> dict:
    """Train with DDP, the gradients reduced by `hook` (None: DDP's own gloo allreduce)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    x_train, x_test, y_train, y_test = (torch.from_numpy(a) for a in load_digits_split(args.seed))
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(x_train.shape[1], args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10))
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    state = ringtree.torch.HookState(comm)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = len(y_train) // args.batch_size
    history = []
    for epoch in range(args.epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(len(y_train))
        communicated_before, start, losses = state.seconds, time.perf_counter(), []
        for step in range(steps_per_epoch):
            mine = torch.from_numpy(order[step * args.batch_size:(step + 1) * args.batch_size][rank::size])
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x_train[mine]), y_train[mine])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        seconds = time.perf_counter() - start
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(dim=1) == y_test).float().mean())
        record = {"epoch": epoch + 1, "loss": float(np.mean(losses)), "test_accuracy": accuracy,
                  "examples_per_second": steps_per_epoch * args.batch_size / seconds,
                  "communication_share": (state.seconds - communicated_before) / seconds}
        history.append(record)
        if show:
            print(f"epoch {record['epoch']:>3}: loss {record['loss']:.4f}  test {accuracy:.2%}  "
                  f"{record['examples_per_second']:,.0f} examples/s"
                  + (f"  communication {record['communication_share']:.1%} of step time" if hook else ""),
                  flush=True)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    return {"history": history, "identical": len(set(comm.allgather(digest))) == 1}


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    if args.batch_size % comm.Get_size():
        raise SystemExit(f"--batch-size {args.batch_size} must be a multiple of the {comm.Get_size()} ranks")
    show = comm.Get_rank() == 0
    init_gloo(comm)
    if show:
        print(f"DDP on {comm.Get_size()} ranks, gradients by ringtree.torch.{HOOKS[args.hook].__name__}", flush=True)
    ours = train(args, comm, HOOKS[args.hook], show)
    if not args.no_compare:
        if show:
            print("the same steps with DDP's own gloo allreduce:", flush=True)
        theirs = train(args, comm, None, show)
        if show:
            rate = [np.median([r["examples_per_second"] for r in run["history"]]) for run in (ours, theirs)]
            print(f"throughput, median over epochs: ringtree {rate[0]:,.0f} examples/s, gloo {rate[1]:,.0f}: "
                  f"{rate[0] / rate[1]:.2f}x; final test accuracy {theirs['history'][-1]['test_accuracy']:.2%} "
                  "with gloo", flush=True)
    dist.destroy_process_group()
    report(ours, comm, args.target_accuracy)  # of ringtree's run

if __name__ == "__main__":
    main()
