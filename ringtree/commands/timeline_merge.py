"""`python -m ringtree timeline-merge`: per-rank RINGTREE_TIMELINE files into one trace."""

from __future__ import annotations

import argparse
import json

from ..words import counted
from .arguments import UsageError, json_file, output_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", type=json_file, metavar="FILE", help="one rank's trace each")
    parser.add_argument("-o", "--output", type=output_path, required=True, help="the merged trace")


def check(args: argparse.Namespace) -> None:
    if any("traceEvents" not in trace for trace in args.inputs):
        raise UsageError("every file must be a trace written under RINGTREE_TIMELINE")


def run(args: argparse.Namespace) -> None:
    merge(args.output, args.inputs)
    print(f"wrote {args.output}: {counted(len(args.inputs), 'trace')} merged, "
          f"{counted(sum(len(trace['traceEvents']) for trace in args.inputs), 'event')}")


def merge(output: str, traces: list[dict]) -> None:
    events = [event for trace in traces for event in trace["traceEvents"]]
    with open(output, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
