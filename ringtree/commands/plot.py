"""`python -m ringtree plot`: bus bandwidth against message size, per algorithm, from bench --json files;
or, with --timeline, a merged RINGTREE_TIMELINE trace as bars per rank and kind of op."""

from __future__ import annotations

import argparse

from ..words import counted
from .arguments import REDUCING, UsageError, image_path, json_file, pyplot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", type=json_file, metavar="FILE",
                        help="JSON files written by bench --json (or, with --timeline, one merged trace)")
    parser.add_argument("-o", "--output", type=image_path, default=None,
                        help="image file, its format by its extension: .svg, .png, .pdf, ... (default: busbw.svg, "
                        "or timeline.svg with --timeline)")
    parser.add_argument("--timeline", action="store_true", help="the input is a merged RINGTREE_TIMELINE trace")
    parser.add_argument("--call", type=int, default=None, metavar="N",
                        help="with --timeline: the call to draw, by its number in the trace (default: the last)")


def check(args: argparse.Namespace) -> None:
    if args.call is not None and not args.timeline:
        raise UsageError("--call picks a call of a trace: give --timeline too")
    if args.timeline:
        if len(args.results) != 1 or "traceEvents" not in args.results[0]:
            raise UsageError("--timeline takes one trace merged by `python -m ringtree timeline-merge`")
        calls = _calls(args.results[0])
        if not calls:
            raise UsageError("the trace holds no ops")
        if args.call is not None and args.call not in calls:
            raise UsageError(f"--call {args.call}: the trace holds calls {_numbers(calls)}")
    elif any("rows" not in result for result in args.results):
        traces = any("traceEvents" in result for result in args.results)
        raise UsageError("a trace: plot it with --timeline" if traces else
                         "every file must be one written by `python -m ringtree bench --json`")


def run(args: argparse.Namespace) -> None:
    if args.timeline:
        calls = _calls(args.results[0])
        call = calls[-1] if args.call is None else args.call
        output = args.output or "timeline.svg"
        plot_timeline(args.results[0], output, call)
        print(f"wrote {output}: call {call} of the trace's calls {_numbers(calls)}"
              + (" (--call N for another)" if len(calls) > 1 and args.call is None else ""))
    else:
        output = args.output or "busbw.svg"
        plot(args.results, output)
        print(f"wrote {output}")


def _calls(trace: dict) -> list[int]:
    """The calls a merged trace holds, by number on their communicator, ascending."""
    return sorted({_call(event) for event in trace["traceEvents"] if event.get("ph") == "X"})


def _call(event: dict) -> int:
    return event["args"].get("call", event["args"]["tag"])  # a trace of an older ringtree has the tag only


def _numbers(calls: list[int]) -> str:
    return ", ".join(map(str, calls)) if len(calls) <= 8 else f"{calls[0]} to {calls[-1]} ({len(calls)} calls)"


def plot(results: list[dict], output: str) -> None:
    """One panel per bench result: busbw against size, a line per algorithm."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.5), squeeze=False)
    for ax, result in zip(axes[0], results):
        by_algorithm: dict[str, list[dict]] = {}
        for row in result["rows"]:
            by_algorithm.setdefault(row["algorithm"], []).append(row)
        for name, rows in by_algorithm.items():
            rows.sort(key=lambda r: r["size"])
            ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], marker="o", markersize=3,
                    label=name, linestyle="--" if name == "native" else "-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(title(result), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(output)


def title(result: dict) -> str:
    """A bench result's panel title: the collective (a file of an older bench, without one, is of
    allreduce), its ranks, dtype, the op of a collective that reduces, in place or not, and the machine."""
    collective = result.get("collective", "allreduce")
    op = result.get("op") if collective in REDUCING else None
    return (f"{collective}, {counted(result['ranks'], 'rank')}, {result['dtype']}{' ' + op if op else ''}"
            f"{', in place' if result.get('inplace') else ''}\n{result.get('note') or result['mpi']}")


def plot_timeline(trace: dict, output: str, call: int) -> None:
    """One lane per rank and kind of op (send, recv, reduce, copy), a bar per op, for collective
    `call` (its tag) in a merged trace."""
    plt = pyplot()
    events = [e for e in trace["traceEvents"] if e["ph"] == "X" and _call(e) == call]
    start = min(e["ts"] for e in events)
    kinds = ["send", "recv", "reduce", "copy"]
    colours = dict(zip(kinds, ["tab:blue", "tab:orange", "tab:green", "tab:grey"]))
    lanes = sorted({(e["pid"], e["name"].split()[0]) for e in events}, key=lambda lane: (lane[0], kinds.index(lane[1])))
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(lanes) + 1.2))
    for y, (rank, kind) in enumerate(lanes):
        bars = [((e["ts"] - start) / 1000, e["dur"] / 1000) for e in events
                if e["pid"] == rank and e["name"].startswith(kind)]
        ax.broken_barh(bars, (y - 0.35, 0.7), color=colours[kind], alpha=0.6, edgecolor="black", linewidth=0.3)
    ax.set_yticks(range(len(lanes)), [f"rank {rank} {kind}" for rank, kind in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("ms (a send or receive spans from its posting to its completion)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(output)
