"""torch.distributed's collectives on ringtree's backend against the same calls on gloo and MPI's own
collective of the same bytes, in one run.

    mpiexec -n 2 python scripts/torch-collectives.py [--collectives all_to_all_single,all_to_all_uneven]
                                                     [--sizes 1K,16K,256K,4M,16M] [--iters 9]

Each size is the bytes a rank sends (float32): all_to_all_single against MPI's Alltoall,
all_to_all_uneven (all_to_all_single given splits: rank s sends rank d 1 + (s + d) mod N shares of
the size) against MPI's Alltoallv, all_reduce
against Allreduce, all_gather_single (the size is the whole output) against Allgather,
reduce_scatter_single (the size is the whole input) against Reduce_scatter_block. Every result is
checked against MPI's before timing; timing is bench's (measure.time_in_turns: turns in shuffled
order, medians of the slowest rank). Prints µs per call and the ratios ringtree / gloo and
ringtree / MPI (of speed: above 1 is faster).
"""

import argparse
from functools import partial

from mpi4py import MPI

from ringtree.commands.arguments import format_size, size_list
from ringtree.commands.measure import time_in_turns

COLLECTIVES = ("all_to_all_single", "all_to_all_uneven", "all_reduce", "all_gather_single", "reduce_scatter_single")


def cases(name: str, count: int, comm, groups: dict) -> dict:
    """case -> a call of none; each checked against MPI's result first (ValueError if it differs)."""
    import torch
    import torch.distributed as dist

    size, rank = comm.Get_size(), comm.Get_rank()
    count -= count % size
    data = torch.arange(count, dtype=torch.float32) % 7 + rank
    whole = torch.empty(count, dtype=torch.float32)
    part = torch.empty(count // size, dtype=torch.float32)
    if name == "all_to_all_single":
        out, mpi = torch.empty_like(data), lambda: comm.Alltoall(data.numpy(), whole.numpy())
        function, arguments = dist.all_to_all_single, (out, data)
    elif name == "all_to_all_uneven":  # every row and column of shares adds up to the same
        share = count // (size * (size + 1) // 2)
        sent = [share * (1 + (rank + d) % size) for d in range(size)]
        received = [share * (1 + (s + rank) % size) for s in range(size)]
        data, whole = data[:sum(sent)], whole[:sum(received)]
        out = torch.empty_like(whole)
        mpi = partial(comm.Alltoallv, [data.numpy(), sent], [whole.numpy(), received])
        function, arguments = partial(dist.all_to_all_single, output_split_sizes=received, input_split_sizes=sent), (
            out, data)
    elif name == "all_reduce":
        out, mpi = data.clone(), lambda: comm.Allreduce(data.numpy(), whole.numpy())
        function, arguments = dist.all_reduce, (out,)  # sums of sums: checked once, first
    elif name == "all_gather_single":
        mine = data[:count // size].clone()
        out, mpi = torch.empty(count), lambda: comm.Allgather(mine.numpy(), whole.numpy())
        function, arguments = dist.all_gather_single, (out, mine)
    else:
        out, mpi = part.clone(), lambda: comm.Reduce_scatter_block(data.numpy(), part.numpy())
        function, arguments = dist.reduce_scatter_single, (out, data)

    def torch_call(group):
        function(*arguments, group=group)

    mpi()
    expected = (part if name == "reduce_scatter_single" else whole).clone()
    calls = {"MPI": mpi}
    for label, group in groups.items():
        if name == "all_reduce":
            out.copy_(data)
        torch_call(group)
        if not torch.equal(out, expected):
            raise ValueError(f"{name} on {label}, {count} floats, rank {rank}: not MPI's result")
        calls[label] = (lambda g: lambda: torch_call(g))(group)
    if name == "all_reduce":
        out.zero_()  # timed sums of zeros, not of ever larger sums that overflow
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collectives", default="all_to_all_single",
                        type=lambda text: [c for c in text.split(",") if c],
                        help=f"comma-separated, of {', '.join(COLLECTIVES)}")
    parser.add_argument("--sizes", type=size_list, default=size_list("1K,16K,256K,4M,16M"), help="bytes a rank sends")
    parser.add_argument("--iters", type=int, default=9, help="turns of each case (fewer where they would be slow)")
    args = parser.parse_args()
    unknown = [c for c in args.collectives if c not in COLLECTIVES]
    if unknown or args.iters < 3:
        parser.error(f"unknown collective {unknown[0]!r}" if unknown else "--iters must be at least 3")
    try:
        import torch.distributed as dist

        import ringtree.torch  # noqa: F401  (registers the backend)
    except ImportError as error:
        parser.error(f"needs torch ({error}): run it in a venv with torch, as scripts/test makes .venv-torch")
    comm = MPI.COMM_WORLD
    dist.init_process_group("ringtree")
    groups = {"ringtree": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    show = comm.Get_rank() == 0
    if show:
        print(f"{comm.Get_size()} ranks, float32; µs per call, medians of the slowest rank; speed ratios")
        print(f"{'collective':<22} {'size':>6} {'ringtree':>10} {'gloo':>10} {'MPI':>10} {'vs gloo':>8} {'vs MPI':>7}")
    for name in args.collectives:
        for nbytes in args.sizes:
            seconds = time_in_turns(comm, cases(name, max(nbytes // 4, comm.Get_size()), comm, groups),
                                    0.02, args.iters, 3.0, warmup=20)
            if show:
                ours, gloo, mpi = (seconds[k] * 1e6 for k in ("ringtree", "gloo", "MPI"))
                print(f"{name:<22} {format_size(nbytes):>6} {ours:>10.1f} {gloo:>10.1f} {mpi:>10.1f} "
                      f"{gloo / ours:>7.2f}x {mpi / ours:>6.2f}x", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
