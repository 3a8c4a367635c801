"""The array backend: the one place that knows how to view, allocate and reduce buffers."""

from __future__ import annotations

import numpy as np

from .ops import ReduceOp

_UFUNCS = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
    ReduceOp.LAND: np.logical_and, ReduceOp.LOR: np.logical_or, ReduceOp.LXOR: np.logical_xor,
    ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}


class NumpyBackend:
    name = "numpy"

    @staticmethod
    def owns(array) -> bool:
        return isinstance(array, np.ndarray)

    @staticmethod
    def empty(count: int, dtype: np.dtype) -> np.ndarray:
        return np.empty(count, dtype)

    @staticmethod
    def empty_like(array: np.ndarray) -> np.ndarray:
        return np.empty_like(array)

    @staticmethod
    def reducer(op: ReduceOp):
        """A function reducing `src` into `dst` in place, with no temporary."""
        ufunc = _UFUNCS[op]

        def reduce(dst, src):
            ufunc(dst, src, out=dst)

        return reduce

    @staticmethod
    def copy(dst, src) -> None:
        np.copyto(dst, src)

    @staticmethod
    def finish(output, op: ReduceOp, nranks: int) -> None:
        if op is ReduceOp.AVG:
            np.true_divide(output, nranks, out=output)

    @staticmethod
    def same_memory(a, b) -> bool:
        return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]

    @staticmethod
    def overlaps(a, b) -> bool:
        return np.shares_memory(a, b)


def backend_for(array):
    """The backend that handles `array`, or None."""
    if NumpyBackend.owns(array):
        return NumpyBackend
    return None
