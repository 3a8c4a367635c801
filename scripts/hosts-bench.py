"""Allreduce across emulated hosts: every algorithm, `auto`, MPI's own and the ring in rank order, in
one run, interleaved. Run it under scripts/cluster:

    scripts/cluster --layout 2,2 --placement round-robin -- python scripts/hosts-bench.py -b 1M -e 32M
    scripts/cluster --netns --link-rate 1gbit --layout 2,2 -- python scripts/hosts-bench.py -b 64K -e 64M \\
        --json docs/figures/hosts-2x2-block-1gbit.json

"ring" is the node-aware ring (round the ranks node by node); "ring, rank order" is the same ring
run on a communicator whose ringtree state was made with RINGTREE_TOPOLOGY=flat, the ring every rank
order gives without a topology, in the segments the node-aware ring gets. With --segments, every
algorithm runs in each of those segment sizes and keeps its best. Each time is the median over
repetitions of the slowest rank's time per call (commands/measure.py, time_in_turns); rank 0
prints a Markdown table of MiB/s and of speed-ups against the ring in rank order and the fastest
flat algorithm, and writes JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial

import numpy as np
from mpi4py import MPI

from ringtree import settings
from ringtree.algorithms import ALGORITHMS
from ringtree.allreduce import allreduce
from ringtree.commands.arguments import at_least, format_size, parse_size, size_grid, size_list
from ringtree.commands.measure import time_in_turns
from ringtree.runtime.session.state import comm_state
from ringtree.tuning.selector import select

FLAT = ("ring, rank order", "tree", "recursive_doubling", "rabenseifner", "double_tree")  # nodes not told apart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", type=at_least(4, parse_size), default=1 << 20, help="smallest size in bytes (default 1M)")
    parser.add_argument("-e", type=at_least(4, parse_size), default=32 << 20, help="largest size (default 32M)")
    parser.add_argument("-f", type=at_least(2), default=2, help="factor between sizes (default 2)")
    parser.add_argument("--iters", type=at_least(3), default=5, help="repetitions per size (default 5)")
    parser.add_argument("--budget", type=float, default=4.0, help="seconds per call and size at most (default 4)")
    parser.add_argument("--segments", type=size_list, default=None,
                        help="time every algorithm in each of these segment sizes (e.g. 256K,1M,4M) and keep its "
                             "best (default: the segment size a call naming it gets on this layout)")
    parser.add_argument("--json", help="write the times here")
    args = parser.parse_args()
    if args.e < args.b:
        parser.error(f"no sizes: -b {args.b} is above -e {args.e}")
    world = MPI.COMM_WORLD
    nodes = world.Dup()
    topology = comm_state(nodes).topology
    os.environ["RINGTREE_TOPOLOGY"] = "flat"
    settings.reload()
    flat = world.Dup()
    comm_state(flat)  # made flat now: the ring in rank order
    results, segments = {}, {}
    for nbytes in size_grid(args.b, args.e, args.f):
        calls = calls_of(nodes, flat, nbytes, topology, args.segments)
        tuner = comm_state(nodes).tuner
        for _ in range(100):  # online tuning's trials first: `auto` is timed once it has chosen
            calls["auto"]()
            if tuner is None or not tuner.explorations:
                break
        timed = time_in_turns(nodes, calls, 0.05, args.iters, args.budget)
        results[nbytes], segments[nbytes] = {}, {}
        for case, seconds in timed.items():  # each algorithm's best segment size
            name, _, segment = case.partition(" @ ")
            if seconds < results[nbytes].get(name, float("inf")):
                results[nbytes][name], segments[nbytes][name] = seconds, segment
    if world.Get_rank() != 0:
        return
    print(f"{world.Get_size()} ranks, {topology}; MiB/s (bytes / time), and speed-ups against the ring in rank "
          f"order and the fastest flat algorithm ({', '.join(FLAT)})"
          + (f"; each algorithm's best of segments {args.segments}, which follow the table" if args.segments else "")
          + "\n")
    print(table(results))
    if args.segments:
        print("\nbest segment sizes: " + "; ".join(
            f"{format_size(n)}: " + ", ".join(f"{name} {s}" for name, s in by.items() if s) for n, by in segments.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": world.Get_size(), "topology": list(topology.node_of), "layout": str(topology),
                       "network": os.environ.get("CLUSTER_NETWORK", "not scripts/cluster"),
                       "segments": {str(n): by for n, by in segments.items()},
                       "iters": args.iters, "seconds": {str(n): t for n, t in results.items()}}, f, indent=1)


def table(results: dict) -> str:
    """A Markdown table of MiB/s per size and call, and the hierarchical allreduce's and `auto`'s
    speed-ups: `results` maps bytes to {call: seconds}."""
    names = list(next(iter(results.values())))
    lines = ["| size | " + " | ".join(names) + " | hierarchical / ring, rank order | hierarchical / best flat | "
             "auto / best flat |", "|---:|" + "---:|" * (len(names) + 3)]
    for nbytes, times in results.items():
        best = min(times[name] for name in FLAT)
        cells = [f"{nbytes / times[name] / 2**20:.0f}" for name in names]
        ratios = [times["ring, rank order"] / times["hierarchical"], best / times["hierarchical"], best / times["auto"]]
        lines.append(f"| {format_size(nbytes)} | " + " | ".join(cells + [f"{r:.2f}" for r in ratios]) + " |")
    return "\n".join(lines)


def calls_of(nodes, flat, nbytes: int, topology, segments) -> dict:
    """The calls timed, as "name" or "name @ segment": the ring in rank order with the segment size
    the node-aware calls get, so that only the order differs."""
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    calls = {}
    for name in (*ALGORITHMS, "ring, rank order"):
        comm, algorithm = (flat, "ring") if name == "ring, rank order" else (nodes, name)
        for segment in segments or [select(nbytes, topology.nranks, "float32", "sum", algorithm, None, topology).segment]:
            case = f"{name} @ {format_size(segment)}" if segment else name
            calls[case] = partial(allreduce, x, out, comm=comm, algorithm=algorithm, segment=segment or nbytes)
    calls["auto"] = lambda: allreduce(x, out, comm=nodes)
    calls["MPI"] = lambda: nodes.Allreduce(x, out)
    return calls


if __name__ == "__main__":
    main()
