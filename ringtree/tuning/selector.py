"""Choose an algorithm and a segment size for a call: from a measured tuning table, else a cost model.

A pure function of values equal on every rank (message size, rank count,
dtype, op, and the tuning table, whose hash the ranks compare once per
communicator), so every rank picks the same.

The table is JSON, rules tried in order, the first that matches wins (as in
Open MPI's dynamic rules):

    {"format": "ringtree-tuning-1", "note": "where and how it was measured",
     "rules": [{"ranks": [2, 2], "bytes": [0, 4096], "algorithm": "native", "segment": 0,
                "without_native": {"algorithm": "recursive_doubling", "segment": 0}},
               {"ranks": [2, 2], "bytes": [4097, 65536], "algorithm": "recursive_doubling", "segment": 0},
               {"ranks": [4, 4], "nodes": [2, 2], "ranks_per_node": [2, 2], "bytes": [65537, null],
                "algorithm": "hierarchical", "segment": 1048576},
               ...],                      # bytes, ranks, nodes, ranks_per_node (the most on any node):
                                          # inclusive, null for no upper bound; nodes and ranks_per_node
                                          # left out: any; segment 0: unsplit; "native": MPI's own,
                                          # "without_native" for calls it cannot run
     "models": {"2": {"alpha": 4e-06, "beta": 3e-10, "gamma": 2e-10}, ...},
     "segments": {"2": {"ring": 4194304, "double_tree": 2097152, ...}, ...},
     "measured": {"2": [{"bytes": 8, "algorithm": "ring", "segment": 0, "seconds": 2.1e-05}, ...], ...},
     "collectives": {"reduce_scatter": {"2": {"rules": [{"bytes": [0, 524288], "algorithm": "native",
                                                         "segment": 0}, ...],
                                              "without_native": [...], "measured": [...]}, ...}, ...}}

"collectives" holds the other collectives' rules (tuning/collectives.py reads them), per collective
and rank count: by size, MPI's own ("native") a candidate, and "without_native" for calls it cannot
run. A rule may also list "dtypes" and "ops" it is limited to. Sizes or rank counts
no rule covers go to the α-β-γ model (ringtree.model) with the parameters
fitted at the nearest measured rank count. "segments" gives, per rank count,
the segment size for an algorithm a call names (or the model picks); "measured", the times the
rules rest on, is there to explain them (the selector does not read it). `python -m ringtree tune` writes
tables; RINGTREE_TUNING_FILE=path loads one instead of the packaged default,
RINGTREE_ALGORITHM=name takes that algorithm wherever a call says "auto".
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import resources
from typing import NamedTuple

from .. import settings
from ..algorithms import ALGORITHMS, GENERATORS, REGISTRY, SHIPPED, Algorithm, added
from ..debug import log
from ..schedule.collectives import COLLECTIVES
from ..schedule.topology import Topology
from .model import Params, predict
from .online import NATIVE

__all__ = ["Choice", "TuningTable", "select", "choice_of", "runs_stepwise", "use_table", "table", "packaged_table",
           "identity", "log_choice",
           "WINDOW", "FALLBACK_MODEL", "FORMAT"]

# Segment size on several nodes when neither the table's rule nor the caller gives one: messages
# between nodes pipeline through the nodes' links in smaller pieces (docs/performance.md, across hosts).
SEGMENT_BYTES_ACROSS_NODES = 256 << 10
# Segments in flight into scratch per collective: scratch is segment × WINDOW.
WINDOW = 4
# α, β, γ for rank counts with no fitted model (docs/algorithms.md says where they were fitted).
FALLBACK_MODEL = Params(alpha=1.2e-5, beta=2.5e-10, gamma=2.5e-10)
FORMAT = "ringtree-tuning-1"


class Choice(NamedTuple):
    algorithm: str
    segment: int  # bytes per segment; 0: messages are not split
    stepwise: bool  # a blocking call may take the stepwise path: runs_stepwise()
    source: str  # why: "call", "RINGTREE_ALGORITHM", "table <file> rule <i>" or "model"


class TuningTable:
    """Rules and fitted models, as loaded from a table file."""

    def __init__(self, data: dict, origin: str) -> None:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{origin}: not a ringtree tuning table (format {found!r}, expected {FORMAT!r})")
        for i, rule in enumerate(data.get("rules", [])):
            if not isinstance(rule, dict) or rule.get("algorithm") not in (*ALGORITHMS, NATIVE):
                raise ValueError(f"{origin}: rule {i} names unknown algorithm "
                                 f"{rule.get('algorithm') if isinstance(rule, dict) else rule!r}")
            for bounds in ("ranks", "bytes", "nodes", "ranks_per_node"):
                if (bounds in rule or bounds in ("ranks", "bytes")) and not _is_range(rule.get(bounds)):
                    raise ValueError(f"{origin}: rule {i} needs \"{bounds}\": [low, high] (high null for no bound), "
                                     f"not {rule.get(bounds)!r}")
            otherwise = rule.get("without_native")
            if rule["algorithm"] == NATIVE and (otherwise.get("algorithm") if isinstance(otherwise, dict)
                                                else None) not in ALGORITHMS:
                raise ValueError(f"{origin}: rule {i} takes MPI's own allreduce but names no algorithm of ringtree's "
                                 "in \"without_native\" for the calls MPI cannot reduce")
        self.collectives = {name: {int(n): lists for n, lists in by_ranks.items()}
                            for name, by_ranks in data.get("collectives", {}).items()}
        _check_collectives(self.collectives, origin)
        self.origin = origin
        self.rules = data.get("rules", [])
        self.models = {int(n): Params(**p) for n, p in data.get("models", {}).items()}
        self.segments = {int(n): s for n, s in data.get("segments", {}).items()}
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        self.digest = hashlib.sha256(canonical).hexdigest()[:16]

    @classmethod
    def load(cls, path: str) -> TuningTable:
        with open(path) as f:
            return cls(json.load(f), os.path.basename(path))

    def match(self, nbytes: int, nranks: int, dtype: str | None, op: str | None,
              topology: Topology | None = None) -> tuple[int, dict] | None:
        nodes = topology.nodes if topology is not None else 1
        per_node = max(topology.ranks_per_node) if topology is not None else nranks
        for i, rule in enumerate(self.rules):
            if (_within(rule["ranks"], nranks) and _within(rule["bytes"], nbytes)
                    and _within(rule.get("nodes", [1, None]), nodes)
                    and _within(rule.get("ranks_per_node", [1, None]), per_node)
                    and ("dtypes" not in rule or dtype in rule["dtypes"])
                    and ("ops" not in rule or op in rule["ops"])):
                return i, rule
        return None

    def model(self, nranks: int) -> Params:
        if not self.models:
            return FALLBACK_MODEL
        return self.models[_nearest(self.models, nranks)]

    def segment(self, nranks: int, algorithm: str, nbytes: int) -> int:
        """The measured segment size for `algorithm` at the nearest rank count, for sizes no larger
        than the table's rules for it cover (a segment that did best at 64 KiB would cut 64 MiB into
        4096 pieces); else the default."""
        default = (REGISTRY["allreduce"].get(algorithm) or Algorithm).segment
        if not self.segments:
            return default
        nearest = _nearest(self.segments, nranks)
        if nbytes > self.covered(nearest):
            return default
        return self.segments[nearest].get(algorithm, default)

    def covered(self, nranks: int) -> float:
        """The largest size the rules for `nranks` cover (an old table's open end: no limit)."""
        ends = [rule["bytes"][1] for rule in self.rules if rule["ranks"][0] <= nranks <= rule["ranks"][1]]
        return max((float("inf") if end is None else end for end in ends), default=0)


def _check_collectives(collectives: dict, origin: str) -> None:
    """ValueError unless every rank count of every collective has rules by size for a call MPI's own
    can run and for one it cannot, each naming an algorithm of that collective."""
    for name, by_ranks in collectives.items():
        if name not in GENERATORS or COLLECTIVES[name].modelled:  # its rules are the table's own
            raise ValueError(f"{origin}: \"collectives\" names unknown collective {name!r}")
        for nranks, lists in by_ranks.items():
            for kind, known in (("rules", (*GENERATORS[name], NATIVE)), ("without_native", GENERATORS[name])):
                rules = lists.get(kind)
                if not rules:
                    raise ValueError(f"{origin}: {name} on {nranks} ranks has no {kind!r}")
                for i, rule in enumerate(rules):
                    if rule.get("algorithm") not in known:
                        raise ValueError(f"{origin}: {name} on {nranks} ranks, {kind} {i} names unknown algorithm "
                                         f"{rule.get('algorithm')!r}")


def _is_range(bounds) -> bool:
    """Whether `bounds` is a rule's [low, high]: whole numbers, high null for no bound."""
    return (isinstance(bounds, list) and len(bounds) == 2 and type(bounds[0]) is int
            and (bounds[1] is None or type(bounds[1]) is int and bounds[1] >= bounds[0]))


def _within(bounds: list, value: int) -> bool:
    """Whether `value` lies in [low, high] (high None: no upper bound)."""
    low, high = bounds
    return low <= value and (high is None or value <= high)


def _nearest(by_ranks: dict, nranks: int) -> int:
    return min(by_ranks, key=lambda n: (abs(n - nranks), n))


def default_table() -> TuningTable:
    path = settings.current().tuning_file
    if path:
        try:
            return TuningTable.load(path)
        except OSError as error:
            raise settings.SettingError(f"RINGTREE_TUNING_FILE={path!r}: {error.strerror}") from None
        except ValueError as error:  # not JSON, or not a table (a bench's results, say)
            raise settings.SettingError(f"RINGTREE_TUNING_FILE={path!r}: {error}; it takes a table written by "
                                        "`python -m ringtree tune`") from None
    return packaged_table()


def packaged_table() -> TuningTable:
    """The table ringtree ships (ringtree/tuning/default.json)."""
    global _packaged
    if _packaged is None:
        text = resources.files(__package__).joinpath("default.json").read_text()
        _packaged = TuningTable(json.loads(text), "ringtree/tuning/default.json")
    return _packaged


_table: TuningTable | None = None
_packaged: TuningTable | None = None


def table() -> TuningTable:
    global _table
    if _table is None:
        _table = default_table()
    return _table


def use_table(new: TuningTable | None) -> None:
    """Make `new` the table every later choice reads (None: the default again). Collective in effect:
    call it on every rank, before the communicators it should apply to are first used."""
    global _table
    _table = new


def identity() -> str:
    """What every rank's choices depend on besides the call: the table, RINGTREE_ALGORITHM and the
    program's own algorithms (ringtree.register_algorithm)."""
    own = "; ".join(f"{collective} {entry.name}={entry.origin}{' (offered to auto)' if entry.offered else ''}"
                    for collective, entry in added())
    return (f"table {table().origin} ({table().digest}), RINGTREE_ALGORITHM={settings.current().algorithm or 'unset'}"
            + (f", algorithms registered: {own}" if own else ""))


def select(nbytes: int, nranks: int, dtype: str | None = None, op: str | None = None,
           algorithm: str = "auto", segment: int | None = None, topology: Topology | None = None,
           native: bool = False) -> Choice:
    """The algorithm and segment size for an allreduce of `nbytes` on `nranks` ranks, laid out on
    nodes as `topology` says (None: one node). `native`: MPI's own allreduce can run the call, where
    a rule of the table takes it."""
    source = "call"
    across = topology is not None and topology.nodes > 1  # the table's model and segments are of one node
    if algorithm == "auto":
        algorithm = settings.current().algorithm
        source = "RINGTREE_ALGORITHM"
    if algorithm is None:
        found = table().match(nbytes, nranks, dtype, op, topology)
        if found is not None:
            i, rule = found
            if rule["algorithm"] == NATIVE and not native:
                rule = rule["without_native"]
            algorithm, source = rule["algorithm"], f"table {table().origin} rule {i}"
            if segment is None:
                segment = rule.get("segment", 0) or nbytes
        else:
            params = table().model(nranks)  # of ringtree's own algorithms: a program's own has no model
            algorithm = "hierarchical" if across else min(SHIPPED["allreduce"], key=lambda name: predict(
                name, nranks, nbytes, params, segment or table().segment(nranks, name, nbytes)))
            source = "model"
    if segment is None:
        segment = SEGMENT_BYTES_ACROSS_NODES if across else table().segment(nranks, algorithm, nbytes)
    return choice_of(algorithm, nbytes, segment, source)


def choice_of(algorithm: str, nbytes: int, segment: int, source: str) -> Choice:
    """The Choice that runs `algorithm` with `segment`: unsplit where the message is no larger."""
    segment = segment if nbytes > segment else 0
    return Choice(algorithm, segment, runs_stepwise(algorithm, nbytes, segment), source)


def runs_stepwise(algorithm: str, nbytes: int, segment: int) -> bool:
    """Whether a blocking call takes the stepwise path (runtime/engine/stepwise.py): messages not split, and
    no larger than the algorithm's limit (its registry entry's stepwise_max)."""
    entry = REGISTRY["allreduce"].get(algorithm)  # None for MPI's own
    return not segment and nbytes <= (entry or Algorithm).stepwise_max


_logged: set = set()


def log_choice(collective: str, choice: Choice, nbytes: int, nranks: int, dtype, op) -> None:
    """With RINGTREE_DEBUG=1, log each distinct choice once, as NCCL_DEBUG=INFO does (an allreduce's with
    its op)."""
    key = (collective, choice, nbytes, nranks, str(dtype), str(op))
    if key in _logged:
        return
    _logged.add(key)
    log.info("%s %d B %s%s on %d ranks: %s, segment %s, from %s", collective, nbytes, dtype,
             "" if COLLECTIVES[collective].named else f" {op}", nranks, choice.algorithm,
             f"{choice.segment} B" if choice.segment else "none", choice.source)
