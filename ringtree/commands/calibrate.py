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
selector gives it, and the simulator's costs are fitted to those times
(sim/calibration.py). The file keeps the primitives, both fits and the
measurements; the simulator uses the better fit. Timing is bench's: turns in
shuffled order, medians of the slower rank. Other ranks wait.

On ranks MPI sees on several nodes (scripts/cluster, a cluster), rank 0 and the first rank of
another node then exchange messages too, and α and β between nodes are fitted from them alone
(`between_nodes` in the file: the simulator's cost of a message between nodes, with --layout).

Everything is measured in `--passes` passes over the sizes (every other one
from the largest size down), and each case keeps the median of its passes, the
time of a typical run, which is what a bench run measures: a machine's speed
can move between passes seconds apart (docs/simulation.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np
from mpi4py import MPI

from ..algorithms import ALGORITHMS
from ..api.allreduce import allreduce
from ..runtime.session.state import comm_state
from ..sim.calibration import (
    FITTED,
    FORMAT,
    best_fit,
    fit_latency_and_per_byte,
    fit_per_byte,
    fit_protocols,
    refitted,
    relative_error,
)
from ..tuning.selector import select
from .arguments import UsageError, at_least, format_size, json_file, output_path, parse_size, size_grid, warn
from .measure import COSTS, in_pass_order, poor_fit, time_in_turns

# Between nodes, α is fitted to messages up to BETWEEN_SMALL bytes and β to those from BETWEEN_LARGE.
BETWEEN_SMALL = 2 << 10
BETWEEN_LARGE = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", type=output_path, default="calibration.json",
                        help="JSON file for α, β, γ and the measurements")
    parser.add_argument("-e", "--maxbytes", type=at_least(64 << 10, parse_size), default=parse_size("64M"),
                        help="largest size measured (at least 64K: γ is fitted from 64 KiB up)")
    parser.add_argument("--iters", type=at_least(1), default=5, help="timed repetitions per size and pass")
    parser.add_argument("--passes", type=at_least(1), default=9, help="times over the sizes; each case keeps the median")
    parser.add_argument("--note", default="", help="a line about the machine, kept in the file")
    parser.add_argument("--refit", metavar="FILE", type=_readable,
                        help="measure nothing: fit the simulator again to the measurements in FILE, a file this "
                             "command wrote, and write the result to --output (no mpiexec needed)")


def _readable(path: str) -> str:
    json_file(path)
    return path


def check(args: argparse.Namespace) -> None:
    if args.refit and json_file(args.refit).get("format") != FORMAT:
        raise UsageError(f"--refit {args.refit}: not a file written by `python -m ringtree calibrate`")
    if not args.refit and MPI.COMM_WORLD.Get_size() < 2:
        raise UsageError("calibrate measures 2 ranks: mpiexec -n 2 python -m ringtree calibrate (or --refit FILE)")


def run(args: argparse.Namespace) -> dict | None:
    if args.refit:
        return refit(args.refit, args.output)
    world = MPI.COMM_WORLD
    topology = comm_state(world).topology
    pair = world.Split(0 if world.Get_rank() < 2 else MPI.UNDEFINED, world.Get_rank())
    result = None
    if pair != MPI.COMM_NULL:
        result = _calibrate(pair, args)
        pair.Free()
    _wait_idle(world)
    if topology.nodes > 1:
        # Rank 0 and the first rank of another node: messages between nodes, fitted on their own.
        other = topology.ranks_on(1)[0]
        across = world.Split(0 if world.Get_rank() in (0, other) else MPI.UNDEFINED, world.Get_rank())
        if across != MPI.COMM_NULL:
            between = _calibrate_between(across, args)
            across.Free()
            if result is not None:
                result.update(between_nodes=between, topology=list(topology.node_of))
                with open(args.output, "w") as f:
                    json.dump(result, f, indent=1)
                print(f"between nodes (ranks 0 and {other}): alpha {between['alpha']:.3g} s, "
                      f"beta {between['beta']:.3g} s/B; written to {args.output}")
                poor = poor_fit("the messages between nodes", [COSTS[name] for name in ("alpha", "beta")
                                                               if between[name] <= 0])
                if poor:
                    warn(poor)
        _wait_idle(world)
    return result


def _wait_idle(comm: MPI.Comm) -> None:
    """A barrier that sleeps while it waits: ranks not measured must leave the cores to those that are."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(1e-3)


def _calibrate_between(pair: MPI.Comm, args) -> dict:
    """α and β of a Sendrecv exchange between two ranks on different nodes, 8 B to --maxbytes,
    medians of --passes passes."""
    sizes = size_grid(8, max(args.maxbytes, 4 * BETWEEN_LARGE), 4)
    runs = {nbytes: [] for nbytes in sizes}
    for k in range(args.passes):
        for nbytes in in_pass_order(sizes, k):
            runs[nbytes].append(_time_primitives(pair, nbytes, args.iters)["message"])
    seconds = {n: float(np.median(times)) for n, times in runs.items()}
    # α from small messages, β from large ones: a capped link lets a short burst through faster than
    # its rate (tc's token bucket), so a fit over all sizes would take its rate for faster than it is.
    alpha, _ = fit_latency_and_per_byte({n: t for n, t in seconds.items() if n <= BETWEEN_SMALL})
    beta = fit_per_byte({n: t - alpha for n, t in seconds.items() if n >= BETWEEN_LARGE})
    return {"alpha": alpha, "beta": beta, "message_seconds": {str(n): t for n, t in seconds.items()}}


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
        print(f"medians of {args.passes} pass{'' if args.passes == 1 else 'es'}:")
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
        if fitted["gamma"] < 0.01 * primitives["gamma"]:
            print(f"  (gamma at its bound, 0: the fit puts the reductions' cost in beta, as each byte a rank receives "
                  f"is reduced once; measured alone, a byte reduced took {primitives['gamma'] * 1e12:.1f} ps)")
        warn_if_poor(primitives, fitted, collectives)
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
    return result


def refit(path: str, output: str) -> dict:
    """The calibration in `path` with its fits made again from its own measurements, by this
    version's simulator and fit, written to `output`."""
    data = refitted(json_file(path))
    with open(output, "w") as f:
        json.dump(data, f, indent=1)
    print(f"refitted to the allreduce times in {path}: {describe(data)}; written to {output}")
    warn_if_poor(data["primitives"], data, [(m["algorithm"], m["bytes"], m["segment"], m["seconds"])
                                            for m in data["allreduce_seconds"]])
    return data


def warn_if_poor(primitives: dict, fitted: dict, collectives) -> None:
    """A warning on stderr where a fit is poor (measure.poor_fit): the primitives' α, β or γ at 0 (a
    message or a reduction measured alone cannot cost nothing), or the fit to the allreduce times
    with α or β at 0 (γ at 0 there has its note above) or far from the times it was fitted to."""
    poor = poor_fit("the primitives", [COSTS[name] for name in COSTS if primitives[name] <= 0])
    if poor:
        warn(poor)
    fitted_params = {key: fitted[key] for key in (*FITTED, "eager_limit", "duplex")}
    poor = poor_fit("the simulator's costs to the allreduce times", [COSTS[name] for name in ("alpha", "beta")
                                                                    if fitted[name] <= 0],
                    relative_error(collectives, fitted_params))
    if poor:
        warn(poor)


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
