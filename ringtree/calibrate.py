"""`python -m ringtree calibrate`: fit the simulator's α, β, γ on this machine (under mpiexec, 2+ ranks).

First the primitives, on ranks 0 and 1, for sizes of 8 B to 64 MiB: they
exchange messages with Sendrecv (both ways at once, as the simulator's ports
are full duplex), timing T = α + β·bytes, and both reduce float32 arrays with
numpy at once, timing T = γ·bytes (from 64 KiB up, where numpy's call overhead
is small). The fits minimise the relative error, so small sizes set α and
large ones β. MPI libraries send small messages eagerly and large ones after a
handshake (rendezvous), so the message fit also looks for the size where the
latency steps up: `eager_limit`, above which a message costs `alpha_rendezvous`.

A Python allreduce is more than its messages, though: a call has a fixed cost
(argument checks, plan lookup), the engine's bookkeeping adds to every
message, and on shared memory the copies of a message and the reductions
compete for the same cores. So then every algorithm runs as an allreduce on
the two ranks, 1 KiB to 64 MiB in steps of 2, with the segment size the
selector gives it, and α, α_rendezvous, β, γ, the per-call `overhead` and
the per-message `setup` (which makes an exchange dearer than a one-way
message) are refitted so that the simulator, running each call as the engine
does (a step at a time where the lean path takes it), reproduces those times
(least relative error; Gauss-Newton steps on the simulator, which is
piecewise linear in its parameters). That fit is made twice: with
full-duplex ports, and with one port per rank for both directions (where, as
over shared memory, the processors at both ends copy a message's bytes, so a
rank's send and receive do not overlap), each with the eager limit that fits
best; the better one is kept. The file keeps the primitives, both fits and
the measurements; the simulator uses the better fit. Timing is bench's:
turns in shuffled order, medians of the slower rank. Other ranks wait.

Everything is measured in `--passes` passes over the sizes (every other one
from the largest size down), and each case keeps the median of its passes: on
the 2-core VM this was written on, the machine's speed at cache-sized messages
moved by up to 2.5x between passes seconds apart, and a single pass fitted
whichever speed it met. The median is the time of a typical run, which is what
a bench run measures; nine short passes (5 repetitions each) sample more
moments than three long ones in the same time.
"""

from __future__ import annotations

import argparse
import functools
import json

import numpy as np
from mpi4py import MPI

from .algorithms import ALGORITHMS
from .allreduce import allreduce
from .bench import in_pass_order, time_in_turns
from .cli import at_least, format_size, parse_size, size_grid
from .model import relative_nnls
from .selector import WINDOW, select, takes_lean_path
from .sim import rank_programs, run_programs

FORMAT = "ringtree-calibration-1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", default="calibration.json", help="JSON file for α, β, γ and the measurements")
    parser.add_argument("-e", "--maxbytes", type=at_least(64 << 10, parse_size), default=parse_size("64M"),
                        help="largest size measured (at least 64K: γ is fitted from 64 KiB up)")
    parser.add_argument("--iters", type=at_least(1), default=5, help="timed repetitions per size and pass")
    parser.add_argument("--passes", type=at_least(1), default=9, help="times over the sizes; each case keeps the median")
    parser.add_argument("--note", default="", help="a line about the machine, kept in the file")
    parser.add_argument("--refit", metavar="FILE",
                        help="measure nothing: fit the simulator again to the measurements in FILE, a file this "
                             "command wrote, and write the result to --output (no mpiexec needed)")


def run(args: argparse.Namespace) -> dict | None:
    if args.refit:
        return refit(args.refit, args.output)
    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        raise SystemExit("calibrate needs at least 2 ranks: mpiexec -n 2 python -m ringtree calibrate")
    pair = world.Split(0 if world.Get_rank() < 2 else MPI.UNDEFINED, world.Get_rank())
    result = None
    if pair != MPI.COMM_NULL:
        result = _calibrate(pair, args)
        pair.Free()
    world.Barrier()
    return result


def _calibrate(pair: MPI.Comm, args) -> dict:
    rank = pair.Get_rank()
    message_sizes = size_grid(8, args.maxbytes, 2)  # steps of 2: the eager limit is one of these sizes
    allreduce_sizes = size_grid(1 << 10, args.maxbytes, 2)
    progress = None
    if rank == 0:
        from tqdm import tqdm
        progress = tqdm(total=args.passes * (len(message_sizes) + len(allreduce_sizes)), unit="size",
                        desc="calibrate", disable=None)
    primitive_runs = {nbytes: [] for nbytes in message_sizes}  # {"message": s, "reduce": s} per pass
    allreduce_runs = {nbytes: [] for nbytes in allreduce_sizes}  # {algorithm: s} per pass
    for k in range(args.passes):
        for nbytes in in_pass_order(message_sizes, k):
            primitive_runs[nbytes].append(_time_primitives(pair, nbytes, args.iters))
            if progress is not None:
                progress.update()
        for nbytes in in_pass_order(allreduce_sizes, k):
            allreduce_runs[nbytes].append(_time_allreduces(pair, nbytes, args.iters))
            if progress is not None:
                progress.update()
    if progress is not None:
        progress.close()

    messages = {n: float(np.median([run["message"] for run in runs])) for n, runs in primitive_runs.items()}
    reductions = {n: float(np.median([run["reduce"] for run in runs])) for n, runs in primitive_runs.items()}
    alpha, alpha_rendezvous, eager_limit, beta = fit_protocols(messages)
    primitives = {"alpha": alpha, "alpha_rendezvous": alpha_rendezvous, "eager_limit": eager_limit, "beta": beta,
                  "overhead": 0.0, "gamma": fit_per_byte({n: t for n, t in reductions.items() if n >= 64 << 10})}
    collectives = [(name, nbytes, select(nbytes, 2, "float32", "sum", name).segment,
                    float(np.median([run[name] for run in runs])))
                   for nbytes, runs in allreduce_runs.items() for name in ALGORITHMS]
    if rank == 0:
        print(f"medians of {args.passes} passes:")
        for nbytes in message_sizes:
            print(f"  {format_size(nbytes):>8}: message {messages[nbytes] * 1e6:10.2f} us, "
                  f"reduce {reductions[nbytes] * 1e6:10.2f} us")
        print("primitives: " + describe(primitives))
        for nbytes in allreduce_sizes:
            print(f"  {format_size(nbytes):>8}: " + ", ".join(
                f"{name} {seconds * 1e6:.1f} us" for name, n, _, seconds in collectives if n == nbytes), flush=True)
    fitted, fits = best_fit(collectives, primitives)
    result = {"format": FORMAT, **fitted, "fits": fits, "primitives": primitives, "nranks": 2,
              "mpi": MPI.Get_library_version().splitlines()[0].strip(), "note": args.note,
              "passes": args.passes,
              "message_seconds": {str(n): t for n, t in messages.items()},
              "reduce_seconds": {str(n): t for n, t in reductions.items()},
              "allreduce_seconds": [{"algorithm": a, "bytes": n, "segment": s, "seconds": t,
                                     "passes": [run[a] for run in allreduce_runs[n]]}
                                    for a, n, s, t in collectives]}
    if rank == 0:
        print(f"fitted to the allreduce times: {describe(fitted)}; written to {args.output}")
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
    return result


def refit(path: str, output: str) -> dict:
    """The calibration in `path` with its fits made again from its own measurements, by this version's
    simulator and fit, written to `output`."""
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != FORMAT:
        raise SystemExit(f"calibrate --refit: {path} is not a ringtree calibration file")
    collectives = [(m["algorithm"], m["bytes"], m["segment"], m["seconds"]) for m in data["allreduce_seconds"]]
    fitted, fits = best_fit(collectives, data["primitives"])
    data.update(fitted, fits=fits)  # every fitted key, the eager limit and the port model replaced
    with open(output, "w") as f:
        json.dump(data, f, indent=1)
    print(f"refitted to the allreduce times in {path}: {describe(fitted)}; written to {output}")
    return data


def _time_primitives(pair: MPI.Comm, nbytes: int, iters: int) -> dict:
    """Median seconds of a Sendrecv exchange of `nbytes` with the other rank and of a float32 sum of
    `nbytes` on both ranks at once."""
    peer = 1 - pair.Get_rank()
    out, into = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    left, right = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
    total = np.empty_like(left)
    return time_in_turns(pair, {
        "message": lambda: pair.Sendrecv([out, MPI.BYTE], peer, 0, [into, MPI.BYTE], peer, 0),
        "reduce": lambda: np.add(left, right, out=total)}, 1e-3, iters, 2.0)


def _time_allreduces(pair: MPI.Comm, nbytes: int, iters: int) -> dict:
    """Median seconds of every algorithm's allreduce of `nbytes` of float32, with the selector's
    segment size for it."""
    data = np.ones(nbytes // 4, np.float32)
    reduced = np.empty_like(data)
    return time_in_turns(pair, {name: functools.partial(allreduce, data, reduced, comm=pair, algorithm=name)
                                for name in ALGORITHMS}, 1e-3, iters, 2.0)


def describe(params: dict) -> str:
    return (f"alpha {params['alpha'] * 1e6:.2f} us per message ({params['alpha_rendezvous'] * 1e6:.2f} us above "
            f"{format_size(params['eager_limit'])}), beta {params['beta'] * 1e12:.1f} ps per byte, "
            f"gamma {params['gamma'] * 1e12:.1f} ps per byte reduced, overhead {params['overhead'] * 1e6:.2f} us per call"
            + (f", setup {params['setup'] * 1e6:.2f} us per message" if params.get("setup") else "")
            + ("" if params.get("duplex", True) else ", one port per rank"))


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
    logs = [np.log(_simulated(*collective[:3], params) / collective[3]) for collective in collectives]
    return float(np.sqrt(np.mean(np.square(logs))))


def _simulated(algorithm: str, nbytes: int, segment: int, params: dict) -> float:
    """simulate(algorithm, 2, nbytes, ..., blocking=...).time for a blocking call as the engine runs it
    (a step at a time where selector.takes_lean_path says so), with the programs built once for all
    the fits' costs."""
    return run_programs(_programs(algorithm, nbytes, segment), algorithm, 2, nbytes, 4, segment, **params).time


@functools.lru_cache(maxsize=None)
def _programs(algorithm: str, nbytes: int, segment: int) -> list[tuple]:
    return rank_programs(algorithm, 2, nbytes // 4, max(1, segment // 4) if segment else 0, WINDOW,
                         blocking=takes_lean_path(algorithm, nbytes, segment))


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
        return _simulated(algorithm, nbytes, segment, {"eager_limit": eager_limit, "duplex": duplex,
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


def fit_per_byte(seconds: dict[int, float]) -> float:
    """γ ≥ 0 minimising the relative error of γ·bytes over {bytes: seconds}."""
    sizes = np.array(list(seconds), float)
    return float(relative_nnls(sizes[:, None], np.array(list(seconds.values())))[0])


def load(path: str, duplex: bool | None = None) -> dict:
    """The simulator's costs from a file written by calibrate, as keyword arguments for simulate():
    the better fit, or the one with full-duplex ports (duplex=True) or one port per rank (False)."""
    with open(path) as f:
        data = json.load(f)
    if data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a ringtree calibration file (format {data.get('format')!r})")
    if duplex is not None and "fits" in data:
        data = data["fits"]["full duplex" if duplex else "one port"]
    elif duplex is False and data.get("duplex", True):
        raise ValueError(f"{path} has no fit with one port per rank")
    return {**{key: float(data[key]) for key in FITTED if key != "setup"},
            "setup": float(data.get("setup", 0.0)),  # files written before the setup cost have none
            "eager_limit": int(data["eager_limit"]), "duplex": bool(data.get("duplex", True))}
