"""`python -m ringtree cache`: what online tuning has learned on this machine, and --clear to forget it.

The cache is a file per machine and rank layout in RINGTREE_CACHE_DIR (by
default $XDG_CACHE_HOME/ringtree, else ~/.cache/ringtree). Each line shows a
kind of call (size class, in place or not, element size, whether the MPI
library's own allreduce was a candidate) and the algorithm it committed to.

    python -m ringtree cache
    python -m ringtree cache --clear
"""

from __future__ import annotations

import argparse
import json

from .. import settings
from ..tuning import cache
from ..words import counted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clear", action="store_true", help="delete the cache files")


def run(args: argparse.Namespace) -> None:
    directory = settings.current().cache_dir
    paths = cache.files(directory)
    if not paths:
        print(f"no tuning cache in {directory}")
        return
    if args.clear:
        for path in paths:
            path.unlink()
        print(f"deleted {counted(len(paths), 'tuning cache file')} in {directory}")
        return
    for path in paths:
        text = cache.read(path)
        try:
            who = json.loads(text)["identity"]
        except (ValueError, KeyError, TypeError):
            print(f"{path}: not a ringtree tuning cache (run with --clear to delete it)")
            continue
        choices = cache.parse(text, who)
        print(f"{path}: {counted(len(who['layout']), 'rank')} on {', '.join(who['hosts'])}; {who['mpi']}; "
              f"ringtree {who['ringtree']}")
        for key, option in sorted(choices.items()):
            print(f"  {key}: {option}")
