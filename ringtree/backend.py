"""The array backend: the one place that knows how to view, allocate and reduce buffers."""

from __future__ import annotations

import numpy as np

from .ops import ReduceOp


def _minimum(left, right, out):
    np.minimum(left, right, out=out)  # numpy 2.4 deprecates a positional out for minimum and maximum


def _maximum(left, right, out):
    np.maximum(left, right, out=out)


_UFUNCS = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: _minimum, ReduceOp.MAX: _maximum,
    ReduceOp.LAND: np.logical_and, ReduceOp.LOR: np.logical_or, ReduceOp.LXOR: np.logical_xor,
    ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}


class NumpyBackend:
    """numpy arrays on the host."""

    @staticmethod
    def owns(array) -> bool:
        return isinstance(array, np.ndarray)

    @staticmethod
    def empty_like(array: np.ndarray) -> np.ndarray:
        return np.empty_like(array)

    @staticmethod
    def empty(count: int, dtype: np.dtype) -> np.ndarray:
        return np.empty(count, dtype)

    @staticmethod
    def as_bytes(array: np.ndarray) -> np.ndarray:
        return array.view(np.uint8)

    @staticmethod
    def reducer(op: ReduceOp):
        """A function (left, right, out) writing left (+) right into out, with no temporary: the ufunc
        itself where it takes out by position (a keyword costs a ufunc call about 0.4 µs)."""
        return _UFUNCS[op]

    @staticmethod
    def copy(dst, src) -> None:
        np.copyto(dst, src)

    @staticmethod
    def divide(output, nranks: int) -> None:
        np.true_divide(output, nranks, out=output)

    @staticmethod
    def aliasing(a, b) -> str | None:
        """None if a and b are apart in memory, "same" if they are one region, else "overlap"."""
        if a is b:
            return "same"
        if a.flags.owndata and b.flags.owndata:  # two allocations of numpy's own never overlap
            return None
        if not np.may_share_memory(a, b):
            return None
        if a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.nbytes == b.nbytes:
            return "same"
        return "overlap" if np.shares_memory(a, b) else None


def backend_for(array):
    """The backend that handles `array`, or None."""
    if type(array) is np.ndarray or NumpyBackend.owns(array):
        return NumpyBackend
    return None
