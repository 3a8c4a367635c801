"""The α-β-γ cost model: predicted time of each algorithm, and a fit of α, β, γ to measurements.

T = a·α + b·n·β + c·n·γ for a message of n bytes on N ranks, where α is the
cost of one message (latency plus per-call overhead), β the time per byte sent
and γ the time per byte reduced, and (a, b, c) count, for each algorithm, the
messages, bytes sent and bytes reduced along its critical path. Segmenting
multiplies the messages by the number of segments; the overlap it buys is not
modelled, which is why measured tables come first and the model only fills in
rank counts and sizes they do not cover.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np


class Params(NamedTuple):
    alpha: float  # seconds per message
    beta: float  # seconds per byte sent
    gamma: float  # seconds per byte reduced


def coefficients(algorithm: str, nranks: int, nbytes: int, segment: int = 0) -> tuple[float, float, float]:
    """(a, b, c): messages, bytes-per-byte sent and reduced on the critical path of `algorithm`."""
    n = nranks
    if n == 1:
        return 0.0, 0.0, 0.0
    levels = math.ceil(math.log2(n))
    power = 1 << (n.bit_length() - 1)
    rounds = power.bit_length() - 1
    folded = n != power
    if algorithm in ("ring", "hierarchical"):  # on one node, the hierarchical allreduce is the ring's halves
        a, b, c = 2 * (n - 1), 2 * (n - 1) / n, (n - 1) / n
    elif algorithm == "tree":  # the root receives from, then sends to, each of its ⌈log2 N⌉ children in turn
        a, b, c = 2 * levels, 2 * levels, levels
    elif algorithm == "recursive_doubling":
        a, b, c = rounds + 2 * folded, rounds + 2 * folded, rounds + folded
    elif algorithm == "rabenseifner":
        a, b, c = 2 * rounds + 3 * folded, 2 * (power - 1) / power + 2 * folded, (power - 1) / power + folded / 2
    elif algorithm == "double_tree":  # depth ⌊log2 N⌋ up and down; an inner node takes 2 children per level
        depth = max(1, rounds)
        a, b, c = 6 * depth, 2.0, 1.0
    else:
        raise ValueError(f"no cost model for algorithm {algorithm!r}")
    segments = max(1, math.ceil(nbytes / segment)) if segment else 1
    return a * segments, b, c


def predict(algorithm: str, nranks: int, nbytes: int, params: Params, segment: int = 0) -> float:
    """Predicted seconds for one allreduce of `nbytes` on `nranks` ranks."""
    a, b, c = coefficients(algorithm, nranks, nbytes, segment)
    return a * params.alpha + nbytes * (b * params.beta + c * params.gamma)


def fit(measurements: Iterable[tuple[str, int, int, int, float]]) -> Params:
    """α, β, γ ≥ 0 that minimise the relative error over (algorithm, nranks, nbytes, segment, seconds)."""
    rows, times = [], []
    for algorithm, nranks, nbytes, segment, seconds in measurements:
        a, b, c = coefficients(algorithm, nranks, nbytes, segment)
        rows.append((a, b * nbytes, c * nbytes))
        times.append(seconds)
    if not rows:
        raise ValueError("no measurements to fit")
    return Params(*map(float, relative_nnls(np.array(rows), np.array(times))))


def fit_error(measurements: Iterable[tuple[str, int, int, int, float]], params: Params) -> float:
    """How far the model with `params` is from the measurements (as fit() takes them): the root mean
    square of ln(predicted / measured); 0.5 is typically off by a factor of 1.65."""
    logs = [math.log(max(predict(algorithm, nranks, nbytes, params, segment), 1e-15) / seconds)
            for algorithm, nranks, nbytes, segment, seconds in measurements]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else 0.0


def relative_nnls(design: np.ndarray, times: np.ndarray) -> np.ndarray:
    """x ≥ 0 minimising the sum of ((design·x - t) / t)²: every measurement counts alike, whatever its size."""
    scaled = design / times[:, None]
    free = list(range(design.shape[1]))
    while free:
        solution = np.zeros(design.shape[1])
        solution[free] = np.linalg.lstsq(scaled[:, free], np.ones(len(times)), rcond=None)[0]
        negative = [i for i in free if solution[i] < 0]
        if not negative:
            return solution
        free = [i for i in free if i not in negative]
    return np.zeros(design.shape[1])
