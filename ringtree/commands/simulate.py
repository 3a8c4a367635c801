"""`python -m ringtree simulate`: per-rank traffic and predicted time of an allreduce, from the α-β-γ model.

The costs come from a file written by `python -m ringtree calibrate`
(--calibration), else from the values the selector falls back on; each may be
overridden on its own. See docs/simulation.md.
"""

from __future__ import annotations

import argparse
import json

from ..algorithms import ALGORITHMS
from ..sim import Costs, SimResult, simulate
from ..sim.calibration import load
from ..tuning.selector import FALLBACK_MODEL
from ..words import counted
from .arguments import (
    UsageError,
    add_import_argument,
    add_layout_arguments,
    at_least,
    format_size,
    one_of,
    output_path,
    parse_size,
    topology_from,
)

# Above this many lines of ranks with the same traffic, the table gives each column's range instead.
MAX_LINES = 16
OVERRIDES = (("alpha", "seconds per message"), ("beta", "seconds per byte sent"),
             ("gamma", "seconds per byte reduced"), ("overhead", "seconds per call"),
             ("alpha_rendezvous", "seconds per message above --eager-limit"),
             ("setup", "seconds a message holds both its ranks at its start"))
BETWEEN = (("alpha_between", "seconds per message between nodes (with --layout)"),
           ("beta_between", "seconds per byte sent between nodes, on the node's one link each way (with --layout)"),
           ("link_burst", "bytes a node's link passes at --beta before its rate holds, refilled at that rate: a "
                          "token bucket, as tc's tbf (with --alpha-between and --beta-between)"))


def calibration(path: str) -> Costs:
    """An argparse type: the costs in a calibration file."""
    try:
        return load(path)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {error.strerror}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise argparse.ArgumentTypeError(f"{path} is not a calibration written by `python -m ringtree calibrate` "
                                         f"({error})") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_import_argument(parser)
    parser.add_argument("--algorithm", type=one_of(list(ALGORITHMS)), required=True,
                        help=f"one of {', '.join(ALGORITHMS)}")
    parser.add_argument("--ranks", type=at_least(1), required=True)
    parser.add_argument("--bytes", type=at_least(0, parse_size), required=True, help="message size, e.g. 8, 4K, 1MiB, 1G")
    parser.add_argument("--itemsize", type=at_least(1), default=4, help="bytes per element (default 4, float32)")
    parser.add_argument("--segment", type=at_least(0, parse_size), default=0, help="pipeline segments of this many bytes")
    parser.add_argument("--calibration", type=calibration, metavar="FILE",
                        help="α, β, γ from a file written by python -m ringtree calibrate "
                             "(default: the selector's fallback model)")
    for name, meaning in OVERRIDES:
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, help=f"{meaning} (overrides the calibration)")
    for name, meaning in BETWEEN:
        parser.add_argument(f"--{name.replace('_', '-')}", type=at_least(0, parse_size) if name == "link_burst" else float,
                            help=meaning)
    add_layout_arguments(parser)
    parser.add_argument("--eager-limit", type=at_least(0, parse_size), help="bytes: larger messages take --alpha-rendezvous")
    parser.add_argument("--stepwise", action="store_true",
                        help="each rank's ops a step at a time, as a blocking call runs an unsegmented schedule "
                             "up to the algorithm's stepwise_max (its registry entry)")
    parser.add_argument("--duplex", action=argparse.BooleanOptionalAction,
                        help="a send and a receive port per rank (the default), or --no-duplex: one port for both")
    parser.add_argument("--json", metavar="PATH", type=output_path,
                        help="also write the result as JSON ('-': to stdout, instead)")


def costs_from(args: argparse.Namespace) -> Costs:
    costs = args.calibration or Costs(*FALLBACK_MODEL)
    overrides = {name: getattr(args, name) for name in (*dict(OVERRIDES), "eager_limit", "duplex")
                 if getattr(args, name) is not None}
    costs = costs._replace(**overrides)
    between = [getattr(args, name) for name, _ in BETWEEN[:2]]
    if any(value is not None for value in between) or args.link_burst is not None:
        if args.layout is None or None in between:
            raise UsageError("--alpha-between and --beta-between go together, with --layout (and --link-burst with them)")
        costs = costs._replace(between_nodes=tuple(between), link_burst=args.link_burst)
    try:
        costs.check()
    except ValueError as error:
        raise UsageError(str(error)) from None
    return costs


def check(args: argparse.Namespace) -> None:
    costs_from(args)
    topology_from(args, args.ranks)
    if args.bytes % args.itemsize:
        raise UsageError(f"--bytes {args.bytes} is not a whole number of {args.itemsize}-byte elements")
    if args.stepwise and args.segment:
        raise UsageError("--stepwise runs unsegmented schedules only: leave out --segment")


def run(args: argparse.Namespace) -> SimResult:
    costs = costs_from(args)
    topology = topology_from(args, args.ranks)
    result = simulate(args.algorithm, args.ranks, args.bytes, costs, itemsize=args.itemsize, segment=args.segment,
                      stepwise=args.stepwise, progress=True, topology=topology)
    n, k = args.ranks, args.bytes
    ideal = 2 * (n - 1) * k / n
    rounding = ("exact: every chunk holds the same whole number of elements" if (k // args.itemsize) % n == 0 else
                f"chunks hold whole {args.itemsize}-byte elements and differ by one, so a rank's bytes may differ "
                f"from it by up to 2(N-1)·{args.itemsize} = {2 * (n - 1) * args.itemsize} B")
    if args.json:
        summary = {key: value for key, value in vars(result).items() if key != "events"}
        summary.update(costs=costs._asdict(), ring_ideal_bytes_per_rank=ideal, rounding=rounding)
        if args.json == "-":
            print(json.dumps(summary, indent=1))
            return result
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    _print_table(args, costs, result, ideal, rounding, topology)
    if args.json:
        print(f"wrote the result, every rank's traffic, as JSON to {args.json}")
    return result


def _print_table(args, costs: Costs, result: SimResult, ideal: float, rounding: str, topology) -> None:
    n, k = args.ranks, args.bytes
    print(f"# {args.algorithm}, {counted(n, 'rank')}, {format_size(k)} ({counted(k // args.itemsize, 'element')} of "
          f"{args.itemsize} B)"
          + (f", segments of {format_size(args.segment)}" if args.segment else "")
          + (", a step at a time" if args.stepwise else "")
          + f"; alpha {costs.alpha:.3g} s, beta {costs.beta:.3g} s/B, gamma {costs.gamma:.3g} s/B, "
          f"overhead {costs.overhead:.3g} s"
          + (f", above {costs.eager_limit} B alpha {costs.alpha_rendezvous:.3g} s" if costs.eager_limit is not None
             else "") + ("" if costs.duplex else ", one port per rank")
          + (f", setup {costs.setup:.3g} s" if costs.setup else "")
          + (f"; {topology}" if topology is not None else "")
          + (f", between nodes alpha {costs.between_nodes[0]:.3g} s, beta {costs.between_nodes[1]:.3g} s/B"
             if costs.between_nodes else "")
          + (f", links' token bucket {format_size(costs.link_burst)}" if costs.link_burst else ""))
    print(f"predicted time: {result.time * 1e6:.2f} us; total bytes sent {sum(result.bytes_sent)}, "
          f"messages {sum(result.messages_sent)}")
    print(f"{'ranks':>12} {'bytes sent':>14} {'bytes recvd':>14} {'msgs sent':>10} {'msgs recvd':>10} "
          f"{'bytes reduced':>14} {'done at us':>11}")
    rows = list(zip(result.bytes_sent, result.bytes_received, result.messages_sent, result.messages_received,
                    result.bytes_reduced))
    groups, first = [], 0
    for r in range(1, n + 1):  # consecutive ranks with the same traffic share a line
        if r == n or rows[r] != rows[first]:
            groups.append((f"{first}" if r - 1 == first else f"{first}-{r - 1}", rows[first],
                           max(result.finish[first:r])))
            first = r
    summarized = len(groups) > MAX_LINES
    if summarized:  # e.g. uneven chunks: ranks differ by an element or so, and the range says enough
        columns = list(zip(*rows)) + [result.finish]
        low, high = [min(c) for c in columns], [max(c) for c in columns]
        groups = [(f"min of {n}", low[:5], low[5]), (f"max of {n}", high[:5], high[5])]
    for ranks, row, done in groups:
        print(f"{ranks:>12} {row[0]:>14} {row[1]:>14} {row[2]:>10} {row[3]:>10} {row[4]:>14} {done * 1e6:>11.2f}")
    if summarized:
        print(f"(each column's smallest and largest over the {n} ranks; --json lists every rank)")
    if args.algorithm == "ring":
        print(f"ring's ideal per-rank share 2(N-1)/N·K = {ideal:.1f} B; {rounding}")
