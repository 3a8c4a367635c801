"""`python -m ringtree draw`: a schedule as a flow diagram, from the schedules the engine runs.

Ranks are lanes (grouped by node, with --layout), time runs left to right in steps: the schedules are
simulated with unit costs (a message takes one step, a reduction or copy of
the whole message a quarter), so every arrow is one message, from its sender
when it starts to its receiver when it lands, labelled with the elements it
carries. Reductions and copies are marked on their rank's lane. A diagram of
more than MAX_RANKS lanes or MAX_MESSAGES arrows is refused: it would take
minutes to draw and could not be read.
"""

from __future__ import annotations

import argparse

from ..algorithms import ALGORITHMS, GENERATORS
from ..schedule import OpKind
from ..schedule.collectives import COLLECTIVES
from ..sim import Costs, simulate
from ..sim.flat import flat_schedules
from ..sim.simulator import collective_of
from ..words import counted
from .arguments import (
    UsageError,
    add_import_argument,
    add_layout_arguments,
    algorithm_names,
    at_least,
    format_size,
    image_path,
    one_of,
    parse_size,
    pyplot,
    topology_from,
)

MAX_RANKS = 32
MAX_MESSAGES = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_import_argument(parser)
    parser.add_argument("--algorithm", type=one_of(algorithm_names()),
                        required=True, help=f"one of {', '.join(ALGORITHMS)} (allreduce's), or another collective's")
    parser.add_argument("--collective", choices=list(GENERATORS), default="allreduce",
                        help="the collective whose schedule to draw (ringtree.algorithms.GENERATORS has their algorithms)")
    parser.add_argument("--root", type=at_least(0), default=0, help="a broadcast's or reduce's root")
    parser.add_argument("--ranks", type=at_least(1), default=4, help=f"number of ranks (lanes), at most {MAX_RANKS}")
    parser.add_argument("--bytes", type=at_least(0, parse_size), default=None,
                        help="message size, e.g. 64, 1K (default: one element per rank, so a ring chunk is one element)")
    parser.add_argument("--itemsize", type=at_least(1), default=4, help="bytes per element (default 4, float32)")
    parser.add_argument("--segment", type=at_least(0, parse_size), default=0,
                        help="pipeline segments of this many bytes (default: not segmented)")
    add_layout_arguments(parser)
    parser.add_argument("-o", "--output", type=image_path, default=None,
                        help="image file, its format by its extension: .svg, .png, .pdf, ... (default: ALGORITHM.svg)")


def check(args: argparse.Namespace) -> None:
    if args.algorithm not in GENERATORS[args.collective]:
        raise UsageError(f"--algorithm {args.algorithm} is not a {args.collective} algorithm; known: "
                         f"{', '.join(sorted(GENERATORS[args.collective]))}")
    if args.root >= args.ranks:
        raise UsageError(f"--root {args.root} is not a rank: the ranks are 0 to {args.ranks - 1}" if args.ranks > 1
                         else f"--root {args.root} is not a rank: the one rank is 0")
    topology_from(args, args.ranks)
    if args.ranks > MAX_RANKS:
        raise UsageError(f"--ranks {args.ranks}: at most {MAX_RANKS} lanes are drawn (simulate gives the numbers "
                         "for any rank count)")
    nbytes = _nbytes(args)
    if nbytes % args.itemsize:
        raise UsageError(f"--bytes {nbytes} is not a whole number of {args.itemsize}-byte elements")
    segment = max(1, args.segment // args.itemsize) if args.segment else 0
    # Counted from the unsegmented schedules: segmenting splits each message, and building a
    # segmented schedule first could take longer than the drawing that is refused.
    count = nbytes // args.itemsize
    messages = sum(-(-size // (segment or size)) for schedule in flat_schedules(
        args.algorithm, args.ranks, count, itemsize=1,
        collective=collective_of(args.collective, args.ranks, count, args.root))
        for kind, size in zip(schedule.kinds, schedule.sizes) if kind == OpKind.SEND)
    if messages > MAX_MESSAGES:
        raise UsageError(f"{args.algorithm} on {counted(args.ranks, 'rank')}, {format_size(nbytes)}"
                         + (f" in segments of {format_size(args.segment)}" if args.segment else "")
                         + f" sends {messages} messages; at most {MAX_MESSAGES} are drawn: "
                         "fewer ranks, fewer bytes or larger segments")


def _nbytes(args: argparse.Namespace) -> int:
    return args.bytes if args.bytes is not None else args.ranks * args.itemsize


def run(args: argparse.Namespace) -> None:
    segment = max(1, args.segment // args.itemsize) if args.segment else 0
    name = f"{args.collective}-{args.algorithm}" if COLLECTIVES[args.collective].named else args.algorithm
    output = args.output or f"{name}.svg"
    draw(args.algorithm, args.ranks, _nbytes(args) // args.itemsize, output,
         segment=segment, collective=args.collective, root=args.root, topology=topology_from(args, args.ranks))
    print(f"wrote {output}")


def draw(algorithm: str, nranks: int, count: int, output: str, segment: int = 0, collective: str = "allreduce",
         root: int = 0, topology=None) -> None:
    """Draw `algorithm` (of `collective`, from `root`) on `nranks` ranks for `count` elements, `segment`
    elements per segment. With a `topology` of several nodes, the lanes go node by node, each node
    shaded, and a message between nodes also waits for its nodes' links (one message each way)."""
    plt = pyplot()
    nodes = topology is not None and topology.nodes > 1
    costs = Costs(alpha=1.0, beta=0.0, gamma=0.25 / max(count, 1), between_nodes=(1.0, 0.0) if nodes else None)
    result = simulate(algorithm, nranks, count, costs, itemsize=1, segment=segment, trace=True, collective=collective,
                      root=root, topology=topology if nodes else None)
    lanes = topology.node_order if nodes else tuple(range(nranks))
    lane = {rank: k for k, rank in enumerate(lanes)}  # a rank's lane, top to bottom
    width = max(6.0, 1.1 * result.time + 2)
    fig, ax = plt.subplots(figsize=(width, 0.9 * nranks + 1.4))
    for rank in range(nranks):
        ax.axhline(rank, color="0.85", lw=1, zorder=0)
    if nodes:
        for node in range(topology.nodes):
            on = [lane[rank] for rank in topology.ranks_on(node)]
            ax.axhspan(min(on) - 0.45, max(on) + 0.45, color="0.93" if node % 2 else "0.97", zorder=-1)
            ax.text(-0.25, (min(on) + max(on)) / 2, f"node {node}", rotation=90, fontsize=7, ha="right",
                    va="center", color="0.4")
    for event in result.events:
        event = event._replace(rank=lane[event.rank], peer=None if event.peer is None else lane[event.peer])
        region = event.region
        label = f"{region.offset}" if region.count == 1 else f"{region.offset}:{region.offset + region.count}"
        if event.kind == "send":
            ax.annotate("", xy=(event.finish, event.peer), xytext=(event.start, event.rank),
                        arrowprops=dict(arrowstyle="-|>", color="tab:blue", lw=1.2, shrinkA=3, shrinkB=3))
            # A third of the way along: the two arrows of an exchange cross at their middles.
            along = (2 * event.start + event.finish) / 3, (2 * event.rank + event.peer) / 3
            ax.text(*along, label, fontsize=7, ha="center", va="center", color="tab:blue",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none"))
        elif event.kind in ("reduce", "copy"):
            reduce = event.kind == "reduce"
            ax.plot(event.finish, event.rank, marker="o" if reduce else "s", ms=11 if reduce else 8,
                    color="tab:orange" if reduce else "tab:green", zorder=3)
            ax.text(event.finish, event.rank, "+" if reduce else "=", fontsize=8, ha="center", va="center",
                    color="white", zorder=4, fontweight="bold")
            ax.text(event.finish, event.rank - 0.22, label, fontsize=6, ha="center", va="bottom",
                    color="tab:orange" if reduce else "tab:green")
    ax.plot([], [], color="tab:blue", label="message (elements carried)")
    ax.plot([], [], "o", color="tab:orange", label="reduce")
    ax.plot([], [], "s", color="tab:green", label="copy")
    ax.set_yticks(range(nranks), [f"rank {r}" for r in lanes])
    ax.set_ylim(nranks - 0.4, -0.6)
    ax.set_xlim(-0.3, result.time + 0.3)
    ax.set_xlabel("steps (a message takes one)")
    sent = result.bytes_sent
    kind = COLLECTIVES[collective]
    what = (f"{collective} {algorithm}" + (f" from root {root}" if kind.rooted else "")) if kind.named else algorithm
    ax.set_title(f"{what}, {counted(nranks, 'rank')}" + (f" ({topology})" if nodes else "")
                 + f", {counted(count, 'element')}\n{result.time:g} step{'' if result.time == 1 else 's'}; "
                 f"elements sent per rank {min(sent)}"
                 + (f"–{max(sent)}" if max(sent) != min(sent) else ""), fontsize=9)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=7, frameon=False)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)
