"""The commands' arguments, parsed and checked alike: sizes, counts, dtypes, files; and UsageError.

A bad argument is refused while parsing (an argparse type raising
ArgumentTypeError) or by a command raising UsageError before it does
anything; either way `python -m ringtree` prints the usage and the reason and
exits with status 2, on every rank alike.

`--import MODULE` (bench, draw, simulate, tune) brings in a program's own algorithms: main() imports
each MODULE, a module name or a .py file, before it builds the parsers, so that the algorithms it
registers (ringtree.register_algorithm) are among those the arguments take.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys

import numpy as np

from ..algorithms import GENERATORS
from ..schedule.collectives import COLLECTIVES
from ..words import counted

REDUCING = tuple(name for name, kind in COLLECTIVES.items() if kind.reduces)  # the collectives that take an op


class UsageError(Exception):
    """A command's arguments do not go together; main() prints it with the command's usage."""


def not_its_algorithms(collective: str, unknown: list[str], known: list[str]) -> UsageError:
    """The error of --algorithms naming `unknown`, which `collective` has none of."""
    article = "an" if collective[0] in "aeiou" else "a"
    return UsageError(f"--algorithms: {', '.join(unknown)} is not {article} {collective} algorithm; "
                      f"known: {', '.join(known)}")


def parse_size(text: str) -> int:
    """8, 4K, 1MiB, 1.5G: bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def at_least(minimum: int, parse=int):
    """An argparse type: text that `parse` turns into a number of at least `minimum`. Checked while
    parsing, so every rank refuses a bad count before anything runs."""
    def checked(text: str) -> int:
        value = parse(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {text}")
        return value
    checked.__name__ = "size" if parse is parse_size else parse.__name__  # argparse's "invalid size value"
    return checked


def positive(text: str) -> float:
    """An argparse type: a number above 0 (seconds, say)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def size_list(text: str) -> list[int]:
    """An argparse type: comma-separated sizes, each at least 1 byte."""
    try:
        return [at_least(1, parse_size)(word) for word in text.split(",") if word]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of sizes like 1M,4M: {text}") from None


def sizes_from_args(args: argparse.Namespace) -> list[int]:
    """The grid of --minbytes, --maxbytes and --stepfactor; UsageError if it is empty."""
    if args.minbytes > args.maxbytes:
        raise UsageError(f"no sizes: --minbytes {args.minbytes} is above --maxbytes {args.maxbytes}")
    return size_grid(args.minbytes, args.maxbytes, args.stepfactor)


def warn(text: str) -> None:
    """A warning of a command, on stderr: the results on stdout stay as they are. After what stdout
    holds so far, so that in a log the warning follows what it is about."""
    sys.stdout.flush()
    print(f"warning: {text}", file=sys.stderr, flush=True)


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


def dtype(text: str) -> np.dtype:
    """An argparse type: the name of a numpy dtype ringtree reduces (bool, integers, floats, complex)."""
    try:
        found = np.dtype(text)
    except TypeError:
        raise argparse.ArgumentTypeError(f"not a numpy dtype: {text!r}") from None
    if found.kind not in "biufc":
        raise argparse.ArgumentTypeError(f"ringtree reduces bool and numeric dtypes, not {text!r}")
    return found


def one_of(choices, what: str = "algorithm"):
    """An argparse type: one name among `choices`."""
    def checked(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; choose from {', '.join(choices)}")
        return text
    checked.__name__ = what
    return checked


def comma_list(choices, what: str = "algorithm"):
    """An argparse type: comma-separated names among `choices`, at least one."""
    single = one_of(choices, what)

    def checked(text: str) -> list[str]:
        names = [single(word) for word in text.split(",") if word]
        if not names:
            raise argparse.ArgumentTypeError(f"no {what}s in {text!r}")
        return names
    checked.__name__ = f"{what} list"
    return checked


def json_file(text: str) -> dict:
    """An argparse type: a file holding a JSON object, read."""
    try:
        with open(text) as f:
            data = json.load(f)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {error.strerror}") from None
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{text} holds no JSON object")
    return data


def output_path(text: str) -> str:
    """An argparse type: a file a command will write, in a folder that exists ('-' passes as it is)."""
    folder = os.path.dirname(text) or "."
    if text != "-" and not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"no folder {folder} to write {os.path.basename(text)} in")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    # Refused now, not after minutes of measuring.
    if text != "-" and not os.access(text if os.path.exists(text) else folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} may not be written" if os.path.exists(text) else
                                         f"the folder {folder} may not be written")
    return text


IMAGE_FORMATS = ("svg", "png", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp", "svgz")  # matplotlib writes


def image_path(text: str) -> str:
    """An argparse type: an image file a command will write, its format named by its extension."""
    path = output_path(text)
    extension = os.path.splitext(path)[1].lstrip(".").lower()
    if extension not in IMAGE_FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text}: an image file's name ends in one of .{', .'.join(IMAGE_FORMATS)}, "
            + (f"not .{extension}" if extension else "and this one has no extension"))
    return path


def pyplot():
    """matplotlib's pyplot, drawing into files; where matplotlib is not installed, a clear error."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("python -m ringtree plot and draw need matplotlib: pip install 'ringtree[plot]' "
                         "(or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def layout(text: str) -> list[int]:
    """An argparse type: ranks per node, as 2,2 or 2,1,2."""
    from ..schedule.topology import Topology

    try:
        return list(Topology.parse(text).ranks_per_node)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layout", type=layout, help="ranks per node, e.g. 2,2 or 2,1,2 (default: one node)")
    parser.add_argument("--placement", choices=("block", "round-robin"), default="block",
                        help="with --layout: ranks 0..P-1 on node 0 and so on (block), or rank r on node r mod K")


def topology_from(args: argparse.Namespace, nranks: int):
    """The Topology of --layout and --placement for `nranks` ranks (None: one node); UsageError where
    they disagree."""
    from ..schedule.topology import Topology

    if args.layout is None:
        return None
    if sum(args.layout) != nranks:
        raise UsageError(f"--layout {','.join(map(str, args.layout))} has {counted(sum(args.layout), 'rank')}, "
                         f"not {nranks}")
    try:
        return Topology.placed(args.layout, args.placement)
    except ValueError as error:
        raise UsageError(f"--placement {args.placement}: {error}") from None


def add_import_argument(parser: argparse.ArgumentParser) -> None:
    """--import, which main() has acted on before parsing (imported_from): here for the usage and help."""
    parser.add_argument("--import", dest="imports", metavar="MODULE", action="append", default=[],
                        help="a module name or a .py file to import first: the algorithms it registers with "
                             "ringtree.register_algorithm are then among those this command takes (repeatable)")


def imported_from(argv: list[str]) -> None:
    """Import every module --import names in `argv`, in order; UsageError for one that cannot be imported
    (not found, or raising: an algorithm the registration refused, say), with its reason."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--import", dest="imports", action="append", default=[])
    for text in early.parse_known_args(argv)[0].imports:
        try:
            import_module(text)
        except Exception as error:  # whatever the program's module raised: a usage error naming it
            raise UsageError(f"--import {text}: {type(error).__name__}: {error}") from None


def import_module(text: str):
    """The module `text` names (dotted, as `import` takes it) or the .py file it is, imported once."""
    if not (text.endswith(".py") or os.sep in text or "/" in text):
        return importlib.import_module(text)
    path = os.path.abspath(text)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no file {text}")
    for module in list(sys.modules.values()):
        if os.path.abspath(getattr(module, "__file__", None) or "-") == path:
            return module
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if name not in sys.modules:
        sys.modules[name] = module
    if os.path.dirname(path) not in sys.path:  # its neighbours import, as where it runs as a script
        sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if sys.modules.get(name) is module:
            del sys.modules[name]
        raise
    return module


def algorithm_names() -> list[str]:
    """Every collective's algorithm names, once each: ringtree's own and those a program registered."""
    return list(dict.fromkeys(name for algorithms in GENERATORS.values() for name in algorithms))
