"""Reduction operations: what the user may pass as `op`, and which dtypes each one accepts."""

from __future__ import annotations

import inspect
from enum import Enum

import numpy as np
from mpi4py import MPI


class ReduceOp(Enum):
    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    LAND = "land"
    LOR = "lor"
    LXOR = "lxor"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    # Members are singletons: hash by identity, which costs far less than Enum's name hash.
    __hash__ = object.__hash__


_MPI_OPS = [
    (MPI.SUM, ReduceOp.SUM), (MPI.PROD, ReduceOp.PROD), (MPI.MIN, ReduceOp.MIN), (MPI.MAX, ReduceOp.MAX),
    (MPI.LAND, ReduceOp.LAND), (MPI.LOR, ReduceOp.LOR), (MPI.LXOR, ReduceOp.LXOR),
    (MPI.BAND, ReduceOp.BAND), (MPI.BOR, ReduceOp.BOR), (MPI.BXOR, ReduceOp.BXOR),
]
_STRING_OPS = {op.value: op for op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG)}

# numpy dtype kinds: b bool, i signed, u unsigned, f floating, c complex.
# The same pairs MPI allows for its predefined ops, plus float16 and avg.
_KINDS = {
    ReduceOp.SUM: "iufc", ReduceOp.PROD: "iufc", ReduceOp.AVG: "fc",
    ReduceOp.MIN: "iuf", ReduceOp.MAX: "iuf",
    ReduceOp.LAND: "biu", ReduceOp.LOR: "biu", ReduceOp.LXOR: "biu",
    ReduceOp.BAND: "iu", ReduceOp.BOR: "iu", ReduceOp.BXOR: "iu",
}
_KIND_NAMES = {"b": "bool", "i": "signed integer", "u": "unsigned integer", "f": "floating", "c": "complex"}


_BY_HANDLE = {mpi_op.handle: ours for mpi_op, ours in _MPI_OPS}
# mpi4py's predefined Op objects live as long as the process, so their ids are a safe first lookup.
_BY_ID = {id(mpi_op): ours for mpi_op, ours in _MPI_OPS} | {id(ours): ours for ours in ReduceOp}
# The MPI op that computes each of ours; avg is MPI's SUM, divided by the number of ranks after.
MPI_OP = {ReduceOp.AVG: MPI.SUM, **{ours: mpi_op for mpi_op, ours in _MPI_OPS}}


def parse_op(op) -> ReduceOp:
    """An MPI.Op among MPI's predefined ones, or one of the strings sum, prod, min, max, avg."""
    known = _BY_ID.get(id(op))
    if known is not None:
        return known
    if isinstance(op, MPI.Op):
        try:
            return _BY_HANDLE[op.handle]
        except KeyError:
            raise ValueError(f"unsupported op {op_name(op)}: ringtree reduces with "
                             "SUM, PROD, MIN, MAX, LAND, LOR, LXOR, BAND, BOR, BXOR") from None
    if isinstance(op, str):
        try:
            return _STRING_OPS[op.lower()]
        except KeyError:
            raise ValueError(f"unknown op {op!r}; use one of {sorted(_STRING_OPS)} or an MPI.Op") from None
    if isinstance(op, ReduceOp):
        return op
    raise TypeError(f"op must be an MPI.Op or a string, got {type(op).__name__}")


_OP_NAMES = {getattr(MPI, name).handle: f"MPI.{name}" for name in dir(MPI)
             if isinstance(getattr(MPI, name), MPI.Op) and getattr(MPI, name) != MPI.OP_NULL}


def op_name(op: MPI.Op) -> str:
    """An MPI.Op as a user wrote it: MPI.MAXLOC, or "a user-defined MPI.Op"."""
    return _OP_NAMES.get(op.handle, "a user-defined MPI.Op")


def known_op(op) -> ReduceOp | None:
    """parse_op's answer for MPI's predefined ops, ReduceOp members and names (objects that stay the
    same for the whole run, so callers may cache by them); None for anything else."""
    known = _BY_ID.get(id(op))
    if known is None and type(op) is str:
        return _STRING_OPS.get(op.lower())
    return known


def kind_of(dtype: np.dtype) -> str:
    """numpy's kind of `dtype`, with bfloat16 (ml_dtypes', kind "V" to numpy) a floating dtype."""
    return "f" if dtype.kind == "V" and dtype.name == "bfloat16" else dtype.kind


def check_dtype(dtype: np.dtype, op: ReduceOp) -> None:
    """Raise TypeError unless `op` is defined on `dtype`."""
    if (dtype, op) in _ALLOWED:
        return
    kind = kind_of(dtype)
    if kind not in _KIND_NAMES:
        raise TypeError(f"dtype {dtype} cannot be reduced: ringtree reduces bool and numeric dtypes")
    if kind not in _KINDS[op]:
        allowed = ", ".join(_KIND_NAMES[k] for k in _KINDS[op])
        raise TypeError(f"op {op.value} is not defined for dtype {dtype}; it takes {allowed} dtypes")
    _ALLOWED.add((dtype, op))


_ALLOWED: set[tuple[np.dtype, ReduceOp]] = set()  # pairs check_dtype has passed


class _Named:
    """A default value as help() shows it: by the name it has in mpi4py."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_MPI_NAMES = {id(value): f"MPI.{name}" for name, value in vars(MPI).items()
              if isinstance(value, (MPI.Op, MPI.Info, MPI.Comm, MPI.Datatype))}


def named_defaults(*functions) -> None:
    """Give each function a signature that names MPI's objects among its defaults (op=MPI.SUM), where
    help() would show <mpi4py.MPI.Op object at 0x...>."""
    for function in functions:
        signature = inspect.signature(function)
        parameters = [p.replace(default=_Named(_MPI_NAMES[id(p.default)])) if id(p.default) in _MPI_NAMES else p
                      for p in signature.parameters.values()]
        function.__signature__ = signature.replace(parameters=parameters)
