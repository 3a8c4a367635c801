"""The tuning table file as `tune` writes it: read (an empty table where there is none) and written
back, whatever else it holds kept."""

from __future__ import annotations

import json
import os

from ..tuning.selector import FORMAT

__all__ = ["read_table", "write_table_file"]


def read_table(path: str) -> dict:
    """The table at `path`, or an empty one where there is no file; SystemExit where the file is not
    a tuning table (it is not overwritten)."""
    data = {"format": FORMAT, "note": "", "rules": [], "models": {}, "segments": {}, "measured": {}}
    if os.path.exists(path):
        with open(path) as f:
            data.update(json.load(f))
    if data.get("format") != FORMAT:
        raise SystemExit(f"{path} is not a ringtree tuning table; not overwriting it")
    return data


def write_table_file(path: str, data: dict, note: str) -> None:
    """`data` into the file at `path`, with `note` (where it was measured) if given."""
    if note:
        data["note"] = note
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
