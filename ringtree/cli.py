"""Sizes and counts on the command line: parsed, checked and printed alike by every command.

Shared by bench, tune, calibrate, simulate, draw and the scripts that read their results.
"""

from __future__ import annotations

import argparse


def parse_size(text: str) -> int:
    """8, 4K, 1MiB, 1.5G: bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def at_least(minimum: int, parse=int):
    """An argparse type: text that `parse` turns into a number of at least `minimum`. Checked while
    parsing, so every rank refuses a bad count before anything runs (a step factor of 1 once grew
    the size grid forever)."""
    def checked(text: str) -> int:
        value = parse(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {text}")
        return value
    checked.__name__ = "size" if parse is parse_size else parse.__name__  # argparse's "invalid size value"
    return checked


def size_list(text: str) -> list[int]:
    """An argparse type: comma-separated sizes, each at least 1 byte."""
    try:
        return [at_least(1, parse_size)(word) for word in text.split(",") if word]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of sizes like 1M,4M: {text}") from None


def sizes_from_args(args: argparse.Namespace) -> list[int]:
    """The grid of --minbytes, --maxbytes and --stepfactor, or an error if it is empty."""
    if args.minbytes > args.maxbytes:
        raise SystemExit(f"no sizes: --minbytes {args.minbytes} is above --maxbytes {args.maxbytes}")
    return size_grid(args.minbytes, args.maxbytes, args.stepfactor)


def format_size(nbytes: int) -> str:
    """8 B, 4 KiB, 256 MiB: the largest binary unit that divides the size."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def size_grid(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """minbytes, minbytes·factor, ... up to maxbytes."""
    sizes = []
    while minbytes <= maxbytes:
        sizes.append(minbytes)
        minbytes *= factor
    return sizes
