"""The calibration file and the fit of the simulator's costs to measured allreduce times (no MPI).

`python -m ringtree calibrate` (commands/calibrate.py) measures; this module
fits and reads. The fit: α, α_rendezvous, β, γ, the per-call `overhead` and the
per-message `setup` such that the simulator, running each call as the engine
does (a step at a time where the stepwise path takes it), reproduces the
measured times (least relative error; Gauss-Newton steps on the simulator,
which is piecewise linear in its costs). It is made twice, with full-duplex
ports and with one port per rank for both directions (where, as over shared
memory, the processors at both ends copy a message's bytes), each with the
eager limit that fits best; the better one is kept, and the file holds both.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from ..tuning.model import relative_nnls
from ..tuning.selector import WINDOW, runs_stepwise
from .events import run_events
from .flat import flat_schedules
from .result import Call, Costs

__all__ = ["FORMAT", "FITTED", "load", "refitted", "best_fit", "relative_error", "simulated", "fit_to_collectives",
           "fit_protocols", "fit_per_byte"]

FORMAT = "ringtree-calibration-1"


def best_fit(collectives, primitives: dict) -> tuple[dict, dict]:
    """fit_to_collectives with full-duplex ports and with one port per rank, each with the eager
    limit (among the measured sizes up to 1 MiB, and the primitives') that fits best: (the better of
    the two, {"full duplex": fit, "one port": fit})."""
    limits = sorted({primitives["eager_limit"], *(1 << k for k in range(10, 21))})
    scored = {}  # port model -> (error, fit) of its best eager limit
    for name, duplex in (("full duplex", True), ("one port", False)):
        start = dict(primitives)
        if not duplex:  # a Sendrecv exchange is then two messages in turn: start from half its costs
            start.update({key: primitives[key] / 2 for key in ("alpha", "alpha_rendezvous", "beta")})
        fits = (fit_to_collectives(collectives, {**start, "eager_limit": limit}, duplex=duplex) for limit in limits)
        scored[name] = min(((relative_error(collectives, fitted), fitted) for fitted in fits), key=lambda pair: pair[0])
    return min(scored.values(), key=lambda pair: pair[0])[1], {name: fitted for name, (_, fitted) in scored.items()}


def relative_error(collectives, params: dict) -> float:
    """The root mean square of log(simulated / measured) over (algorithm, bytes, segment, seconds)."""
    logs = [np.log(simulated(*collective[:3], params) / collective[3]) for collective in collectives]
    return float(np.sqrt(np.mean(np.square(logs))))


def simulated(algorithm: str, nbytes: int, segment: int, params: dict) -> float:
    """simulate(algorithm, 2, nbytes, Costs(**params), stepwise=...).time for a blocking call as the
    engine runs it (a step at a time where selector.runs_stepwise says so), with the schedules built
    once for all the fits' costs."""
    return run_events(_schedules(algorithm, nbytes, segment), Call(algorithm, 2, nbytes, 4, segment),
                      Costs(**params)).time


@functools.cache
def _schedules(algorithm: str, nbytes: int, segment: int) -> list:
    return flat_schedules(algorithm, 2, nbytes // 4, max(1, segment // 4) if segment else 0, WINDOW,
                          stepwise=runs_stepwise(algorithm, nbytes, segment))


FITTED = ("alpha", "alpha_rendezvous", "beta", "gamma", "overhead", "setup")


def fit_to_collectives(collectives, start: dict, steps: int = 6, duplex: bool = True) -> dict:
    """The costs with which the simulator best reproduces (algorithm, bytes, segment, seconds) on 2
    ranks, in relative error; `start`'s eager limit stays. The simulated time is piecewise linear in
    the costs, so each step fits the linearisation at the current point, from the simulator's own
    derivatives."""
    point = np.array([start.get(name, 0.0) for name in FITTED]) + np.array([1e-6, 1e-6, 1e-11, 1e-11, 1e-6, 1e-6])
    times = np.array([seconds for *_, seconds in collectives])
    for _ in range(steps):
        design = np.array([_gradient(c, point, start["eager_limit"], duplex) for c in collectives])
        point = relative_nnls(design, times)
    return {**dict(zip(FITTED, map(float, point))), "eager_limit": start["eager_limit"], "duplex": duplex}


def _gradient(collective, point: np.ndarray, eager_limit: int, duplex: bool) -> list[float]:
    """d(simulated time)/d(cost) at `point`, for each cost: one-sided differences."""
    algorithm, nbytes, segment, _ = collective

    def at(p):
        return simulated(algorithm, nbytes, segment, {"eager_limit": eager_limit, "duplex": duplex,
                                                       **dict(zip(FITTED, p))})
    here = at(point)
    steps = 1e-3 * np.maximum(point, 1e-12)
    return [(at(point + step * unit) - here) / step for step, unit in zip(steps, np.eye(len(FITTED)))]


def fit_protocols(seconds: dict[int, float]) -> tuple[float, float, int, float]:
    """(α, α_rendezvous, eager limit, β): a latency up to the limit, another above it, one β, with the
    limit among the measured sizes that fits best (least relative error)."""
    sizes = np.array(sorted(seconds), float)
    times = np.array([seconds[n] for n in sorted(seconds)])
    best = None
    for limit in sizes[:-1]:
        design = np.stack([sizes <= limit, sizes > limit, sizes], axis=1).astype(float)
        alpha, alpha_rendezvous, beta = solution = relative_nnls(design, times)
        relative = (design @ solution - times) / times
        error = float(relative @ relative)
        if best is None or error < best[0]:
            best = error, float(alpha), float(alpha_rendezvous), int(limit), float(beta)
    return best[1:]


def fit_latency_and_per_byte(seconds: dict[int, float]) -> tuple[float, float]:
    """(α, β) ≥ 0 minimising the relative error of α + β·bytes over {bytes: seconds}."""
    sizes = np.array(list(seconds), float)
    alpha, beta = relative_nnls(np.stack([np.ones_like(sizes), sizes], axis=1), np.array(list(seconds.values())))
    return float(alpha), float(beta)


def fit_per_byte(seconds: dict[int, float]) -> float:
    """γ ≥ 0 minimising the relative error of γ·bytes over {bytes: seconds}."""
    sizes = np.array(list(seconds), float)
    return float(relative_nnls(sizes[:, None], np.array(list(seconds.values())))[0])


def load(path: str, duplex: bool | None = None) -> Costs:
    """The simulator's costs from a file written by calibrate: the better fit, or the one with
    full-duplex ports (duplex=True) or one port per rank (False)."""
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a ringtree calibration file (format {data.get('format')!r})")
    between = data.get("between_nodes")  # measured on several nodes only
    if duplex is not None and "fits" in data:
        data = data["fits"]["full duplex" if duplex else "one port"]
    elif duplex is False and data.get("duplex", True):
        raise ValueError(f"{path} has no fit with one port per rank")
    return Costs(**{key: float(data[key]) for key in FITTED if key != "setup"},
                 setup=float(data.get("setup", 0.0)),  # files written before the setup cost have none
                 eager_limit=int(data["eager_limit"]), duplex=bool(data.get("duplex", True)),
                 between_nodes=(float(between["alpha"]), float(between["beta"])) if between else None)


def refitted(data: dict) -> dict:
    """A calibration file's contents with its fits made again from its own measurements."""
    if data.get("format") != FORMAT:
        raise ValueError("not a ringtree calibration file")
    collectives = [(m["algorithm"], m["bytes"], m["segment"], m["seconds"]) for m in data["allreduce_seconds"]]
    fitted, fits = best_fit(collectives, data["primitives"])
    return {**data, **fitted, "fits": fits}  # every fitted key, the eager limit and the port model replaced
