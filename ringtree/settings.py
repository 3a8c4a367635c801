"""Every RINGTREE_* environment variable, read here and nowhere else: once, at first use.

    from ringtree import settings
    settings.current().timeout      # RINGTREE_TIMEOUT, parsed: seconds or None

Nothing is read at import. The first ringtree call that needs a setting reads
all of them; a bad value raises SettingError (a ValueError) naming the
variable, its value and the values it takes. `reload()` reads the environment
again. An empty variable counts as unset. docs/configuration.md lists the
variables; a test keeps that table and VARIABLES the same.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable
from typing import NamedTuple

from .algorithms import ALGORITHMS

__all__ = ["Settings", "SettingError", "VARIABLES", "cached", "current", "reload", "read", "torch_rendezvous",
           "not_a_folder"]


class SettingError(ValueError):
    """A RINGTREE_* variable holds a value ringtree does not take."""


@dataclasses.dataclass(frozen=True)
class Settings:
    algorithm: str | None = None  # replaces "auto"
    tuning_file: str | None = None  # None: the packaged table
    debug: bool = False
    check: bool = False
    timeout: float | None = None
    timeline: str | None = None  # a path template
    gpu_host_max: int = 16 << 20
    cuda_aware: bool | None = None  # None: ask the MPI library
    tune: str = "online"  # online, cache or off
    cache_dir: str = ""  # where online tuning keeps what it learned; "" until read() fills it in
    stall_warning: float | None = 60.0  # seconds without progress before a warning; None: no warning
    signatures: bool = True  # calls' signatures in their messages' tags, compared (runtime/safety/mismatch.py)
    topology: str = "nodes"  # nodes: learn which ranks share a node; flat: treat all ranks as one node
    transport: str = "auto"  # how device memory moves: auto, ipc, direct or staged (runtime/transports/choice.py)


class Variable(NamedTuple):
    name: str
    field: str  # of Settings
    values: str  # what it takes, as the error and docs/configuration.md say it
    parse: Callable[[str], object]  # raises ValueError for a value it does not take


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError


def _algorithm(text: str) -> str | None:
    if text == "auto":
        return None
    if text not in ALGORITHMS:
        raise ValueError
    return text


def _seconds(text: str) -> float:
    seconds = float(text)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError
    return seconds


def _stall_warning(text: str) -> float | None:
    return None if text in ("0", "off") else _seconds(text)


def _bytes(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError
    return value


def _tune(text: str) -> str:
    if text not in TUNE_MODES:
        raise ValueError
    return text


TUNE_MODES = ("online", "cache", "off")
TOPOLOGIES = ("nodes", "flat")
TRANSPORTS = ("auto", "ipc", "direct", "staged")


def _transport(text: str) -> str:
    if text not in TRANSPORTS:
        raise ValueError
    return text


def _topology(text: str) -> str:
    if text not in TOPOLOGIES:
        raise ValueError
    return text


def _timeline(text: str) -> str:
    """A trace path template whose folder exists and may be written: else the traces would be lost
    at exit, with nothing said."""
    folder = os.path.dirname(text.replace("{rank}", "0")) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"there is no folder {folder} to write the traces in")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"the folder {folder} may not be written")
    return text


def _directory(text: str) -> str:
    """A folder, or a path where one can be made: not one whose nearest existing part is a file, which
    would fail every write of the cache later, far from the variable that caused it."""
    blocking = not_a_folder(text)
    if blocking is not None:
        raise ValueError(f"{blocking} is a file, not a folder" if blocking == text else
                         f"{blocking}, on its path, is a file, not a folder")
    return text


def not_a_folder(path: str) -> str | None:
    """The nearest part of `path` that exists (itself, else a folder above it) where that is not a
    folder; None where it is one, so that `path` is a folder or can be made one."""
    while path and not os.path.exists(path):
        above = os.path.dirname(path.rstrip(os.sep))
        if above == path:
            return None
        path = above
    return path if path and not os.path.isdir(path) else None


def _cuda_aware(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError
    return text == "1"


VARIABLES = (
    Variable("RINGTREE_ALGORITHM", "algorithm", "auto, " + ", ".join(ALGORITHMS), _algorithm),
    Variable("RINGTREE_TUNING_FILE", "tuning_file", "a path to a table written by `python -m ringtree tune`", str),
    Variable("RINGTREE_DEBUG", "debug", "1, true, yes, on or 0, false, no, off", _flag),
    Variable("RINGTREE_CHECK", "check", "1, true, yes, on or 0, false, no, off", _flag),
    Variable("RINGTREE_TIMEOUT", "timeout", "a positive number of seconds", _seconds),
    Variable("RINGTREE_TIMELINE", "timeline", "a path in a folder that exists, where {rank} stands for the rank",
             _timeline),
    Variable("RINGTREE_GPU_HOST_MAX", "gpu_host_max", "a whole number of bytes, 0 or more", _bytes),
    Variable("RINGTREE_CUDA_AWARE", "cuda_aware", "0 or 1", _cuda_aware),
    Variable("RINGTREE_TUNE", "tune", "online, cache or off", _tune),
    Variable("RINGTREE_CACHE_DIR", "cache_dir", "a directory", _directory),
    Variable("RINGTREE_SIGNATURES", "signatures", "1, true, yes, on or 0, false, no, off", _flag),
    Variable("RINGTREE_TOPOLOGY", "topology", "nodes or flat", _topology),
    Variable("RINGTREE_TRANSPORT", "transport", "auto, ipc, direct or staged", _transport),
    Variable("RINGTREE_STALL_WARNING", "stall_warning", "a positive number of seconds, or 0 or off", _stall_warning),
)


_SAYS_WHY = (_timeline, _directory)  # parsers whose ValueError says what is wrong
# Variables no longer read, and why: a program that sets one is told, not silently ignored.
RETIRED = {"RINGTREE_SHM": "ringtree's own shared-memory transport was retired, as MPI's own path between "
                           "the ranks of a node was faster at every size (docs/performance.md)"}


def read(environ=None) -> Settings:
    """The settings that `environ` (default: os.environ) gives; SettingError for a bad value."""
    environ = os.environ if environ is None else environ
    for name, why in RETIRED.items():
        if environ.get(name, "").strip():
            warnings.warn(f"ringtree: {name} is no longer read: {why}", stacklevel=2)
    values = {}
    for variable in VARIABLES:
        text = environ.get(variable.name, "").strip()
        if not text:
            continue
        try:
            values[variable.field] = variable.parse(text)
        except ValueError as error:
            why = str(error) if variable.parse in _SAYS_WHY else ""  # float()'s and int()'s own words say less
            raise SettingError(f"{variable.name}={text!r} is not a value ringtree takes; "
                               f"it takes {variable.values}" + (f": {why}" if why else "")) from None
    caches = environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(environ.get("HOME") or os.path.expanduser("~"),
                                                                       ".cache")
    values.setdefault("cache_dir", os.path.join(caches, "ringtree"))
    return Settings(**values)


_current: Settings | None = None


def current() -> Settings:
    """The settings of this process, read at the first call."""
    global _current
    if _current is None:
        _current = read()
    return _current


def cached() -> Settings | None:
    """The settings the first call read, or None before (a look-up ahead of a call's checks, which must
    leave a bad value for the checks to refuse)."""
    return _current


def reload() -> Settings:
    """Read the environment again (for a program, or a test, that changed it after ringtree's first call)."""
    global _current
    _current = None
    return current()


def torch_rendezvous() -> dict[str, str]:
    """torch.distributed's own variables of an env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE) that are set, as they are now: read at each rendezvous, not with the settings."""
    return {name: os.environ[name] for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
            if os.environ.get(name)}
