"""The command line: `python -m ringtree COMMAND ...`, one module per command, dispatched from COMMANDS.

Each command module has `add_arguments(parser)`, `run(args)` and, where
arguments must agree with each other, `check(args)`, which raises UsageError.
The rules they share: one algorithm is `--algorithm NAME`, several are
`--algorithms A,B`, and `--import MODULE` adds a program's own (arguments.py);
sizes are bytes with K, M, G suffixes; `-o/--output` is the file a command
writes, `--json PATH` its machine-readable results. A bad argument prints the
usage and exits with status 2, never a traceback.
Commands may import any part of ringtree; nothing in ringtree imports them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .. import settings
from .arguments import UsageError, imported_from

__all__ = ["COMMANDS", "main"]

# name -> (module, one line of help)
COMMANDS = {
    "bench": ("bench", "a collective's bandwidth against native MPI's, nccl-tests style (under mpiexec)"),
    "tune": ("tune", "measure every algorithm here and write a tuning table (under mpiexec)"),
    "calibrate": ("calibrate", "fit the simulator's alpha, beta, gamma here (under mpiexec, 2+ ranks)"),
    "simulate": ("simulate", "per-rank traffic and predicted time of an allreduce, from the alpha-beta-gamma model"),
    "draw": ("draw", "a schedule as an SVG flow diagram: ranks as lanes, an arrow per message"),
    "plot": ("plot", "busbw against size from bench --json files, or a merged timeline with --timeline"),
    "timeline-merge": ("timeline_merge", "merge per-rank RINGTREE_TIMELINE files into one"),
    "cache": ("cache", "what online tuning learned on this machine; --clear forgets it"),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ringtree", description="ringtree's tools")
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        imported_from(argv)  # a program's own algorithms, registered before the parsers list the names
        refused = None
    except UsageError as error:
        refused = error
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {}
    for name, (module_name, summary) in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        sub = subparsers.add_parser(name, help=summary, description=module.__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        commands[name] = module, sub
    if refused is not None:  # with the usage of the command it was given to
        named = next((word for word in argv if word in commands), None)
        (commands[named][1] if named else parser).error(str(refused))
    args = parser.parse_args(argv)
    module, sub = commands[args.command]
    try:
        settings.current()
        if hasattr(module, "check"):
            module.check(args)
    except (UsageError, settings.SettingError) as error:
        sub.error(str(error))
    try:
        module.run(args)
    except UsageError as error:
        sub.error(str(error))


def run_from_shell() -> None:
    try:
        main()
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
