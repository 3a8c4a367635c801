"""What online tuning learned, kept on disk: a file per machine and rank layout.

    <RINGTREE_CACHE_DIR>/<digest>.json
    {"format": "ringtree-cache-1",
     "identity": {"hosts": [...], "layout": [host index of each rank], "mpi": "...", "ringtree": "0.1.0"},
     "choices": [{"size_class": 14, "in_place": false, "itemsize": 4, "native": true,
                  "algorithm": "recursive_doubling", "segment": 0}, ...]}

The identity is what makes a measurement hold: the hosts, which rank runs on
which (and so the rank count), the MPI library and ringtree's version; its
digest names the file. One rank reads the file and sends it to the others (so
the ranks cannot start from different caches), and one rank writes it, whole,
to a temporary file it then renames over the old one, so a reader never sees
half a file. Pure apart from the file system: no MPI.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pathlib
import tempfile

from .. import settings
from ..algorithms import offered
from .online import NATIVE, Key, Option

__all__ = ["FORMAT", "identity", "path_for", "parse", "read", "write", "files"]

FORMAT = "ringtree-cache-1"


def identity(hosts: list[str], nodes, mpi: str, version: str) -> dict:
    """The identity of a communicator whose rank r runs on hosts[r], on node nodes[r] (of its
    Topology: where hosts share a name, as emulated ones do, the nodes still tell layouts apart)."""
    names = sorted(set(hosts))
    return {"hosts": names, "layout": [names.index(host) for host in hosts], "nodes": list(nodes), "mpi": mpi,
            "ringtree": version}


def path_for(directory: str, who: dict) -> pathlib.Path:
    digest = hashlib.sha256(json.dumps(who, sort_keys=True).encode()).hexdigest()[:16]
    return pathlib.Path(directory) / f"{digest}.json"


def read(path: pathlib.Path) -> str:
    """The file's text; "" when there is none or it cannot be read (a cache starts empty)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def parse(text: str, who: dict) -> dict[Key, Option]:
    """The choices in a cache file's text, if it is a cache of `who`; else none."""
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("identity") != who:
            return {}
        choosable = {*offered("allreduce"), NATIVE}  # what auto may choose
        return {Key(int(c["size_class"]), bool(c["in_place"]), int(c["itemsize"]), bool(c["native"])):
                Option(c["algorithm"], int(c["segment"]))
                for c in data["choices"] if c["algorithm"] in choosable}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}  # not a cache file of this version: start afresh, and write over it


def write(path: pathlib.Path, who: dict, choices: dict[Key, Option]) -> None:
    """Write the choices, with those another job wrote meanwhile, atomically."""
    merged = parse(read(path), who) | choices
    data = {"format": FORMAT, "identity": who,
            "choices": [{**key._asdict(), **option._asdict()} for key, option in sorted(merged.items())]}
    blocking = settings.not_a_folder(str(path.parent))
    if blocking is not None:  # else mkdir's "File exists", which names neither the file nor the setting
        raise NotADirectoryError(errno.ENOTDIR, f"{blocking} is a file, not a folder: set RINGTREE_CACHE_DIR to a "
                                                "folder for the cache", blocking)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".", suffix=".tmp", delete=False) as f:
        json.dump(data, f, indent=1)
    os.replace(f.name, path)


def files(directory: str) -> list[pathlib.Path]:
    return sorted(pathlib.Path(directory).glob("*.json"))
