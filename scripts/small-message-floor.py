"""What a small allreduce costs in Python at the least, over MPI and over shared memory, beside
ringtree and MPI's own calls. Two ranks.

    mpiexec -n 2 python scripts/small-message-floor.py [--count 1] [--iters 15]

  native       MPI's blocking Allreduce
  persistent   MPI's persistent allreduce (Allreduce_init): Start, then Test until done, from Python
  floor        the least any Python allreduce over MPI must do: check the arguments, one Sendrecv
               with the other rank, one add with numpy
  shared       the exchange alone over memory both ranks map (an MPI shared window), no MPI call
               and no checks, as `persistent`: write the data and then a call number into this
               rank's slot, poll the other rank's number, one add (two slots a rank, taken in turns:
               a rank writes a slot again only once the other has begun the call after the one that
               read it). Only where both ranks share a node; it relies on the CPU keeping stores in
               order (x86 does)
  ringtree     ringtree's allreduce of the same arrays, again and again: auto runs `persistent`'s
               exchange, with what a repeated call checks around it

float64 sum; every case's result is checked first; timing is bench's (measure.time_in_turns):
turns in shuffled order, each a barrier and about 10 ms of back-to-back calls, medians of the
slowest rank.
"""

import argparse
from functools import partial

import numpy as np
from mpi4py import MPI

from ringtree.allreduce import allreduce
from ringtree.api.collective_args import prepared
from ringtree.commands.measure import time_in_turns


class SharedExchange:
    """Two slots of `count` float64 for each of the two ranks, with a call number, in a shared window."""

    def __init__(self, node, count: int) -> None:
        self.rank = node.Get_rank()
        stride = 8 * (1 + 2 * count)  # the call number, then two slots
        self.window = MPI.Win.Allocate_shared(2 * stride if self.rank == 0 else 0, 1, comm=node)
        memory = np.frombuffer(self.window.Shared_query(0)[0], np.uint8)
        numbers = [memory[rank * stride:rank * stride + 8].view(np.int64) for rank in (0, 1)]
        slots = [memory[rank * stride + 8:(rank + 1) * stride].view(np.float64).reshape(2, count) for rank in (0, 1)]
        self.mine, self.theirs = numbers[self.rank], numbers[1 - self.rank]
        self.my_slots, self.their_slots = list(slots[self.rank]), list(slots[1 - self.rank])  # a view of each slot
        self.mine[0], self.calls = 0, 0
        node.Barrier()

    def allreduce(self, data, out) -> None:
        calls = self.calls = self.calls + 1
        slot = calls & 1
        self.my_slots[slot][...] = data
        self.mine[0] = calls  # after the data: the other rank reads the number, then the data
        theirs = self.theirs
        while theirs[0] < calls:
            pass
        np.add(data, self.their_slots[slot], out)

    def free(self) -> None:
        self.window.Free()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1, help="float64 elements (default 1: 8 bytes)")
    parser.add_argument("--iters", type=int, default=15, help="turns per case (medians)")
    args = parser.parse_args()
    if args.count < 1 or args.iters < 1:
        parser.error("--count and --iters must be at least 1")
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("run on 2 ranks")
    private, other = comm.Dup(), 1 - comm.Get_rank()
    data = np.arange(args.count, dtype=np.float64) + comm.Get_rank()
    out, incoming = np.empty_like(data), np.empty_like(data)
    request = comm.Allreduce_init(data, out)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    shared = SharedExchange(node, args.count) if node.Get_size() == 2 else None

    def persistent():
        request.Start()
        while not request.Test():
            pass

    def floor():
        prepared("allreduce", comm, data, out, MPI.SUM)
        private.Sendrecv([data, MPI.BYTE], other, 7, [incoming, MPI.BYTE], other, 7)
        np.add(data, incoming, out)

    cases = {"native": lambda: comm.Allreduce(data, out), "persistent": persistent, "floor": floor,
             "shared": partial(shared.allreduce, data, out) if shared is not None else None,
             "ringtree": lambda: allreduce(data, out, comm=comm)}
    cases = {name: call for name, call in cases.items() if call is not None}
    expected = 2 * np.arange(args.count) + 1.0
    for name, call in cases.items():
        for _ in range(200):
            out[:] = 0
            call()
            if not np.array_equal(out, expected):
                raise SystemExit(f"{name} gave {out}, not {expected}")
    median = time_in_turns(comm, cases, 0.01, args.iters, 3.0)
    if comm.Get_rank() == 0:
        for name, seconds in median.items():
            print(f"{name:>10}: {seconds * 1e6:6.2f} us per call, {seconds / median['native']:4.2f}x native "
                  f"({data.nbytes} bytes)")
        if shared is None:
            print("    shared: the two ranks are not on one node")
    request.Free()
    if shared is not None:
        shared.free()


if __name__ == "__main__":
    main()
