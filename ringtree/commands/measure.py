"""Measuring on this machine, as bench, tune and calibrate do it: inputs checked exactly, timing in turns."""

from __future__ import annotations

import math
import time

import numpy as np
from mpi4py import MPI

from ..ops import MPI_OP, ReduceOp
from ..schedule.collectives import COLLECTIVES, CollectiveKind

__all__ = ["COSTS", "in_pass_order", "whole_elements",
           "exact_inputs", "time_in_turns", "across_ranks", "bus_factor", "table_rows", "candidates",
           "smoothed", "poor_fit", "kind_of", "UNEVEN", "BLIP_WITHIN", "UNSPLIT_MAX_BYTES", "POOR_FIT"]

UNEVEN = {"alltoallv": "alltoall"}  # a collective bench times given counts: the one it is

# A size whose winner differs from both its neighbours' (the same one) takes theirs where that is
# slower by no more than this: on a noisy machine a near-tie would otherwise flip the table for one size.
BLIP_WITHIN = 0.05
# Above this size an unsplit message needs scratch as large as the message, so only segments are tried.
UNSPLIT_MAX_BYTES = 16 << 20
# A fit whose root mean square of ln(fitted / measured) is above this is poor: its times are typically off by
# more than a factor of 1.65, where the shipped table's model and calibration (a 2-core VM) are off by 0.2 to 0.33.
POOR_FIT = 0.5
COSTS = {"alpha": "α (time per message)", "beta": "β (time per byte sent)", "gamma": "γ (time per byte reduced)"}
# Batches a call's warm-up may go on past --warmup until it is warm (time_in_turns' settled): online
# tuning's trials take at most 7 calls of each of 9 candidates.
SETTLING_BATCHES = 100


def in_pass_order(sizes: list, k: int) -> list:
    """The sizes in the order pass k times them: every other pass from the largest down, so that no
    size is always timed at the same moment of a run."""
    return sizes if k % 2 == 0 else sizes[::-1]


def whole_elements(sizes: list[int], dtype, shares: int = 1, per: str = "") -> tuple[list[int], str | None]:
    """The element counts a grid of sizes (bytes) times, ascending and each once: each size rounded
    down to a whole number of `shares` elements (a collective's blocks alike; `per` says what they are
    of, e.g. "per rank on 3 ranks"), at least one; and a note naming the sizes timed as another, or
    None. Rounded rather than refused: a geometric grid of sizes, as nccl-tests' -b/-e/-f, meets whole
    elements per rank at some rank counts and not at others."""
    counts, moved = set(), []
    for nbytes in sizes:
        count = max(1, nbytes // dtype.itemsize // shares) * shares
        counts.add(count)
        if count * dtype.itemsize != nbytes:
            moved.append(f"{nbytes} B as {count * dtype.itemsize} B")
    if not moved:
        return sorted(counts), None
    shown = ", ".join(moved[:4]) + (f" and {len(moved) - 4} more" if len(moved) > 4 else "")
    return sorted(counts), (f"sizes timed in whole {dtype.itemsize}-byte {dtype} elements{' ' + per if per else ''}, "
                            f"rounded down to them (one at least): {shown}")


def exact_data(comm, count: int, dtype) -> np.ndarray:
    """This rank's input: small integers, which every order of summation adds to the same bits, so any
    algorithm's result can be checked exactly."""
    return (np.arange(count) % 7 + comm.Get_rank() % 3 + 1).astype(dtype)


def exact_inputs(comm, count: int, dtype, op: ReduceOp = ReduceOp.SUM) -> tuple[np.ndarray, np.ndarray]:
    """(this rank's input, exact_data, and MPI's own allreduce of it)."""
    data = exact_data(comm, count, dtype)
    expected = np.empty_like(data)
    comm.Allreduce(data, expected, MPI_OP[op])
    if op is ReduceOp.AVG:
        expected /= comm.Get_size()
    return data, expected


def time_in_turns(comm, calls: dict, batch_seconds: float, iters: int, budget: float, warmup: int = 0,
                  settled: dict | None = None) -> dict:
    """Median seconds per call of each of `calls`, the slowest rank's.

    A repetition gives every call a turn: a barrier, then a batch of about
    `batch_seconds` of back-to-back calls. The order of the turns is shuffled
    anew for each repetition (alike on every rank), so no call always follows
    the same other one. `iters` repetitions, or fewer (at least 3) where they
    would take more than `budget` seconds per call. First each call makes at
    least `warmup` untimed calls as its timed ones run, in batches with a
    barrier before each: `auto`'s online tuning times its trials there, which
    choose for the pattern of calls they see (back to back, or one at a time).
    `settled[name]()`, where given, says whether that call is warm: its
    warm-up goes on, batch by batch, until it is on every rank (at most
    SETTLING_BATCHES more).
    """
    for call in calls.values():
        call()  # the first call of a shape builds its plan: not a measure of the rest
    comm.Barrier()
    start = time.perf_counter()
    for call in calls.values():
        call()
    slowest_call = comm.allreduce(time.perf_counter() - start, MPI.MAX) / len(calls)
    batch = max(1, int(batch_seconds / max(slowest_call, 1e-9)))
    iters = max(3, min(iters, int(budget / (slowest_call * batch))))
    batches = -(-warmup // batch)
    for name, call in calls.items():
        warm = (settled or {}).get(name)
        for done in range(batches + (SETTLING_BATCHES if warm is not None else 0)):
            if warm is not None and done >= batches and comm.allreduce(bool(warm()), MPI.LAND):
                break
            comm.Barrier()
            for _ in range(batch):
                call()
    names = list(calls)
    times = {name: [] for name in names}
    for repetition in range(iters):
        for k in np.random.default_rng(repetition).permutation(len(names)):
            call = calls[names[k]]
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(batch):
                call()
            times[names[k]].append((time.perf_counter() - start) / batch)
    slowest = across_ranks(comm, [times[name] for name in names], MPI.MAX)
    return {name: float(np.median(row)) for name, row in zip(names, slowest)}


def across_ranks(comm, values, op):
    local = np.array(values, dtype=np.float64)
    result = np.empty_like(local)
    comm.Allreduce(local, result, op)
    return result


def bus_factor(collective: str, nranks: int) -> float:
    """busbw / algbw, as nccl-tests has it: what each rank's links carry of the size, at best."""
    return kind_of(collective).bus_factor(nranks)


def kind_of(collective: str) -> CollectiveKind:
    """The registry's entry of a collective bench times (alltoallv: the alltoall's)."""
    return COLLECTIVES[UNEVEN.get(collective, collective)]


def table_rows(comm, collective: str, algorithms, count: int, dtype, op, passes: list[tuple[dict, dict]],
               baseline) -> list[dict]:
    """A size's bench rows from its passes ({algorithm: seconds}, {algorithm: wrong elements}): the
    median time, the most wrong elements, nccl-tests' algbw and busbw, the ratio to `baseline`;
    printed on rank 0. `op` None for a collective that reduces nothing."""
    nbytes = count * dtype.itemsize
    median = {name: float(np.median([times[name] for times, _ in passes])) for name in algorithms}
    redop = op.value if op is not None else None
    rows = []
    for name in algorithms:
        seconds = median[name]
        algbw = nbytes / seconds / 1e9
        row = {"collective": collective, "size": nbytes, "count": count, "type": str(dtype), "redop": redop,
               "algorithm": name, "time_us": seconds * 1e6, "algbw": algbw,
               "busbw": algbw * bus_factor(collective, comm.Get_size()),
               "wrong": max(wrong[name] for _, wrong in passes)}
        if len(passes) > 1:
            row["passes_us"] = [times[name] * 1e6 for times, _ in passes]
        if baseline is not None:
            row[f"vs_{baseline}"] = median[baseline] / seconds
        rows.append(row)
        if comm.Get_rank() == 0:
            ratio = f"{row[f'vs_{baseline}']:8.2f}" if baseline is not None else f"{'-':>8}"
            print(f"  {nbytes:>10} {count:>10} {str(dtype):>8} {redop or '-':>5} {name:>18} "
                  f"{row['time_us']:>10.1f} {algbw:>10.3f} {row['busbw']:>10.3f} {row['wrong']:>7} {ratio}",
                  flush=True)
    return rows


def poor_fit(what: str, zero: list[str], error: float | None = None) -> str | None:
    """Why the fit of `what` is poor, or None: the costs named in `zero` came out 0, at the fit's bound
    (costs are fitted >= 0, and these times fit best with them negative), or the fitted times are
    `error` (the root mean square of ln(fitted / measured)) above POOR_FIT."""
    why = []
    if zero:
        them = "it" if len(zero) == 1 else "them"
        why.append(f"{' and '.join(zero)} {'is' if len(zero) == 1 else 'are'} 0, at the fit's bound: these times "
                   f"fit best with {them} negative, which no cost can be")
    if error is not None and error > POOR_FIT:
        why.append(f"the fitted costs miss the measured times by a factor of {math.exp(error):.2f} (the root mean "
                   f"square of ln(fitted / measured); above {math.exp(POOR_FIT):.2f} is poor)")
    if not why:
        return None
    return (f"a poor fit of {what}: " + "; ".join(why) + ". A loaded machine measures so: measure again on an idle "
            "one, or with more --passes")


def candidates(nbytes: int, algorithms: list[str], segments: list[int]) -> list[tuple[str, int]]:
    """(algorithm, segment) pairs worth timing at `nbytes`: unsplit if it is not huge, and every
    segment size smaller than the message."""
    splits = ([0] if nbytes <= UNSPLIT_MAX_BYTES else []) + [s for s in segments if s < nbytes]
    return [(algorithm, segment) for algorithm in algorithms for segment in splits]


def smoothed(times: list[dict]) -> list:
    """The fastest case at each size (`times`: per size, ascending, seconds by case), except that a
    lone size between two of another winner takes theirs where that is within BLIP_WITHIN. A
    crossover stays where it was measured."""
    best = [min(timed, key=timed.get) for timed in times]
    chosen = list(best)
    for i in range(1, len(times) - 1):
        around = best[i - 1]
        if around == best[i + 1] != best[i] and around in times[i] and times[i][around] <= (1 + BLIP_WITHIN) * times[i][best[i]]:
            chosen[i] = around
    return chosen
