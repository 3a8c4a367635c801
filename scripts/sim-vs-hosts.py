"""Simulated against measured across emulated hosts, as a Markdown table: the simulator's two costs
(inside a node, between nodes) against scripts/hosts-bench.py's times.

    python scripts/sim-vs-hosts.py calibration.json hosts.json [--algorithms ring,tree,hierarchical]
        [--min 64K] [--limit 1.3] [--link-burst 128K]

The calibration comes from `python -m ringtree calibrate` run on the same emulated cluster (it fits
α and β between nodes there); the times from scripts/hosts-bench.py --json. Each algorithm is
simulated on the bench's node map with the segment size and path (stepwise or not) its call took.
Exits non-zero if a ratio from --min up is beyond a factor --limit either way.
"""

import argparse
import json
import sys

from ringtree.commands.arguments import format_size, parse_size
from ringtree.schedule.topology import Topology
from ringtree.sim import simulate
from ringtree.sim.calibration import load
from ringtree.tuning.selector import select


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calibration", help="written by python -m ringtree calibrate on the emulated cluster")
    parser.add_argument("hosts", help="written by scripts/hosts-bench.py --json")
    parser.add_argument("--algorithms", default="ring,tree,hierarchical")
    parser.add_argument("--min", type=parse_size, default=64 << 10, help="smallest size compared (default 64K)")
    parser.add_argument("--limit", type=float, default=1.3, help="largest ratio either way (default 1.3)")
    parser.add_argument("--link-burst", type=parse_size, default=None,
                        help="the links' token bucket in bytes (scripts/cluster --link-rate: 128K), simulated")
    args = parser.parse_args()
    try:
        costs = load(args.calibration)
        with open(args.hosts) as f:
            measured = json.load(f)
    except (OSError, ValueError, KeyError) as error:
        parser.error(str(error))
    if costs.between_nodes is None:
        parser.error(f"{args.calibration} has no costs between nodes: calibrate on several nodes")
    costs = costs._replace(link_burst=args.link_burst)
    topology = Topology(tuple(measured["topology"]))
    algorithms = args.algorithms.split(",")
    print(f"{measured['ranks']} ranks, {topology}; simulated / measured time, from {format_size(args.min)}"
          + (f"; links with a token bucket of {format_size(args.link_burst)}" if args.link_burst else "") + "\n")
    print("| size | " + " | ".join(f"{name} measured | simulated | ratio" for name in algorithms) + " |")
    print("|---:|" + "---:|---:|---:|" * len(algorithms))
    worst = 1.0
    for size, times in sorted(measured["seconds"].items(), key=lambda item: int(item[0])):
        nbytes = int(size)
        if nbytes < args.min:
            continue
        cells = []
        for name in algorithms:
            choice = select(nbytes, topology.nranks, "float32", "sum", name, None, topology)
            simulated = simulate(name, topology.nranks, nbytes, costs, segment=choice.segment,
                                 stepwise=choice.stepwise, topology=topology).time
            ratio = simulated / times[name]
            worst = max(worst, ratio, 1 / ratio)
            cells.append(f"{times[name] * 1e3:.2f} ms | {simulated * 1e3:.2f} ms | {ratio:.2f}")
        print(f"| {format_size(nbytes)} | " + " | ".join(cells) + " |")
    print(f"\nlargest ratio either way: {worst:.2f} (limit {args.limit})")
    return 0 if worst <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
