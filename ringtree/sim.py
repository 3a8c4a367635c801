"""The α-β-γ simulator: every rank's schedule of one allreduce, run as discrete events, without MPI.

The model: a message of b bytes takes α + β·b. It holds the sender's send port
and the receiver's receive port for that long (each rank has one of each: full
duplex) and starts once its send and its receive are both posted and both
ports are free. A reduction or copy of b bytes takes γ·b on its rank's one
processor. An optional `overhead` is the fixed cost of a call (a Python call's
argument checks and plan lookup): every rank starts that late. And as MPI
libraries switch from an eager protocol to a rendezvous (a handshake first)
above some size, messages of more than `eager_limit` bytes may take
`alpha_rendezvous` instead of α. With `duplex=False` a rank has one port for
both directions, as where the processors at both ends copy a message over
shared memory: a rank then sends or receives, not both at once. With a
`setup` of h seconds, a message also holds both its ranks for its first
h seconds, so that a rank starts one message at a time: an exchange between
two ranks takes h + α + β·b where a one-way message takes α + β·b, as
measured over shared memory, between full duplex and one port. An op is
posted or started once its dependencies have finished and, for a message,
once the message before it on its channel was posted: as the engine does
(with `blocking`, also once the step before it has finished, as its lean
path does). Messages and reductions waiting for a port or the processor get
it in the order they became ready, ties in schedule order.

The schedules are the engine's own (segmented when `segment` is given), so
the traffic counted is exactly the traffic the engine sends. Messages hold
whole elements of `itemsize` bytes, so where the element count does not
divide evenly, chunks differ by one element and per-rank bytes differ from
the ideal share by that rounding (for ring, at most 2(N-1) elements).

A schedule that its generator declares the same on every rank up to turning
the ranks around (algorithms.TURNING: the ring, less the ops on empty chunks)
is built for rank 0 only, and every rank's op k is simulated at once, as numpy
vectors over the ranks, with the same result as the event simulation; where
that equivalence cannot be shown for the costs given (two ops of a rank's
processor ready at once, say, or one port per rank), the event simulation
runs instead, on every rank's program turned from rank 0's where no chunk is
empty. One whose every P-th rank's schedule is the same up to turning
(algorithms.PERIOD: the ring's where chunks of two lengths split into
different numbers of segments) is simulated on P ranks that stand for all.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gc
import heapq
import itertools
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
import multiprocessing
from typing import NamedTuple

import numpy as np

from .algorithms import ALGORITHMS, PERIOD, TURNING
from .pipeline import segmented
from .schedule import INPUT, OUTPUT, OpKind, Ref, dataflow, even_chunks, in_steps

SEND, RECV, REDUCE, COPY = 0, 1, 2, 3  # REDUCE and COPY run on the processor
_KIND = {OpKind.SEND: SEND, OpKind.RECV: RECV, OpKind.REDUCE: REDUCE, OpKind.COPY: COPY}
KIND_NAMES = ("send", "recv", "reduce", "copy")
# Below this many ranks the schedules are built in this process; above, by one worker per core.
PARALLEL_FROM_RANKS = 128


@dataclass(frozen=True)
class SimResult:
    algorithm: str
    nranks: int
    nbytes: int
    itemsize: int
    segment: int  # bytes per segment; 0: not segmented
    time: float  # seconds until the last rank finishes
    finish: tuple[float, ...]  # per rank: when its last op finishes
    bytes_sent: tuple[int, ...]
    bytes_received: tuple[int, ...]
    messages_sent: tuple[int, ...]
    messages_received: tuple[int, ...]
    bytes_reduced: tuple[int, ...]
    events: tuple[Event, ...] | None = None  # with trace=True: every op, in order of start


class Event(NamedTuple):
    """One op as simulated."""

    rank: int
    index: int
    kind: str  # send, recv, reduce, copy
    peer: int | None
    start: float
    finish: float
    region: Ref  # sent, received into or written


def simulate(algorithm: str, nranks: int, nbytes: int, *, alpha: float, beta: float, gamma: float,
             overhead: float = 0.0, eager_limit: int | None = None, alpha_rendezvous: float | None = None,
             duplex: bool = True, setup: float = 0.0, itemsize: int = 4, segment: int = 0, window: int = 4,
             blocking: bool = False, trace: bool = False, progress: bool = False) -> SimResult:
    """Simulate one allreduce of `nbytes` (whole elements of `itemsize` bytes) on `nranks` ranks.

    `segment` (bytes, 0 for none) and `window` pipeline the schedules as the
    engine does. `duplex=False` gives each rank one port for both directions,
    as where a message's bytes are copied by the processors at both ends over
    shared memory. `setup` (seconds) holds both ranks of a message for its
    first that long, so an exchange costs more than a one-way message.
    `blocking` runs each rank's ops in their listed order, a step at a time,
    as the engine's lean path does for a blocking call of an unsegmented
    schedule up to the selector's BLOCKING_MAX_BYTES. With `trace`, the result
    lists every op's start and finish. With `progress`, a simulation of every
    rank shows progress bars on stderr, where that is a terminal.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(sorted(ALGORITHMS))}")
    if nranks < 1 or nbytes < 0 or itemsize < 1 or nbytes % itemsize:
        raise ValueError(f"need nranks >= 1 and nbytes a multiple of itemsize >= 1, "
                         f"not nranks={nranks} nbytes={nbytes} itemsize={itemsize}")
    if min(alpha, beta, gamma, overhead, setup) < 0:
        raise ValueError(f"alpha, beta, gamma, overhead and setup must be >= 0, "
                         f"not {alpha}, {beta}, {gamma}, {overhead}, {setup}")
    if (eager_limit is None) != (alpha_rendezvous is None) or (alpha_rendezvous or 0) < 0 or (eager_limit or 0) < 0:
        raise ValueError(f"eager_limit and alpha_rendezvous go together, both >= 0, not {eager_limit}, {alpha_rendezvous}")
    if blocking and segment:
        raise ValueError("blocking runs unsegmented schedules only (the engine's lean path); give segment=0")
    count = nbytes // itemsize
    segment_elements = max(1, segment // itemsize) if segment else 0
    turns = TURNING.get(algorithm)
    built_for = turns(nranks, count) if turns is not None else None
    template = None
    if built_for is not None and nranks > 1 and not trace:
        template = _program((algorithm, nranks, 0, built_for, segment_elements, window, itemsize, True, blocking))
    # Both shortcuts need full duplex and no setup: with one port per rank, a port serves two
    # channels, and a setup holds a rank for both, in an order that depends on the times, and
    # ranks alike in schedule need not be alike in time.
    alike = duplex and not setup
    if template is not None and alike:
        with _without_gc():
            result = _run_turned(template, algorithm, nranks, nbytes, count, itemsize, segment, segment_elements,
                                 alpha, beta, gamma, overhead, eager_limit, alpha_rendezvous, built_for)
        if result is not None:
            return result
    period = PERIOD[algorithm](nranks, count) if algorithm in PERIOD else nranks
    if period < nranks and alike and not trace:
        result = _run_periodic(algorithm, nranks, period, nbytes, count, itemsize, segment, segment_elements, window,
                               alpha, beta, gamma, overhead, eager_limit, alpha_rendezvous, blocking)
        if result is not None:
            return result
    programs = turned_programs(template, nranks, count, segment_elements, itemsize) if template is not None else None
    if programs is None:
        programs = rank_programs(algorithm, nranks, count, segment_elements, window, itemsize, trace,
                                 progress=progress, blocking=blocking)
    return run_programs(programs, algorithm, nranks, nbytes, itemsize, segment, alpha, beta, gamma, overhead, trace,
                        eager_limit, alpha_rendezvous, duplex=duplex, progress=progress, setup=setup)


# A schedule that is the same on every rank up to turning the ranks around (algorithms.TURNING) is
# built for rank 0 alone; rank r's op k is rank 0's op k on chunk c + r instead of c, with a peer r
# further on, or no op where that chunk is empty. So op k of every rank can be simulated at once: its
# ready and finish times are vectors over the ranks, a message's other end is its partner's vector
# turned by the peer's distance.
#
# This gives the event simulation's times exactly when every resource serves its ops in a fixed order:
# a rank that sends to one peer and receives from one (full duplex) has one channel per port, served
# in channel order; its processor serves reductions and copies in the order they become ready, which
# is program order when each is ready strictly after the one before (checked after the fact).


def _turned_partners(program: tuple, nranks: int) -> list[int]:
    """For rank 0's messages: the index of the op at rank 0 that stands for the other end."""
    partner = [-1] * len(program[0])
    channels = program[6]
    for (kind, peer), send_indices in channels.items():
        if kind == SEND:
            receive_indices = channels.get((RECV, -peer % nranks), [])
            if len(receive_indices) != len(send_indices):
                raise RuntimeError(f"rank 0 sends {len(send_indices)} messages to rank {peer} but receives "
                                   f"{len(receive_indices)} from rank {-peer % nranks}: the schedule does not turn")
            for j, i in zip(send_indices, receive_indices):
                partner[j], partner[i] = i, j
    return partner


def turned_sizes(program: tuple, nranks: int, count: int, segment: int, built_for: int | None = None):
    """Rank r's op sizes in elements at `count`, as rows of an array (op, rank), 0 for an op it leaves
    out, from rank 0's program built with regions for `built_for` elements (default `count`), for a
    schedule in algorithms.TURNING (segment in elements, 0 for none); None where rank 0's regions are
    not whole chunks, or segments of them, or chunks split into different numbers of segments."""
    kinds, peers, regions = program[0], program[1], program[7]
    built_for = count if built_for is None else built_for
    if not _segments_agree(nranks, count, segment) or not _segments_agree(nranks, built_for, segment):
        return None
    chunks = even_chunks(built_for, nranks)
    starts = [start for start, _ in chunks]
    built_lengths = [length for _, length in chunks]
    lengths = np.array([length for _, length in even_chunks(count, nranks)], dtype=np.int64)
    place: list[tuple[int, int] | None] = [None] * len(kinds)  # (chunk, element offset in it) at rank 0
    for k, region in enumerate(regions):
        if region.buffer in (INPUT, OUTPUT):
            chunk = bisect.bisect_right(starts, region.offset) - 1
            offset = region.offset - starts[chunk]
            if region.count != min(segment or max(built_for, 1), built_lengths[chunk] - offset):
                return None
            place[k] = (chunk, offset)
    partner = _turned_partners(program, nranks)
    for k, region in enumerate(regions):
        if place[k] is None:  # a receive into a slot: the chunk its sender, `peer` ranks on, sends
            sent = place[partner[k]] if kinds[k] == RECV else None
            if sent is None:
                return None
            place[k] = ((sent[0] + peers[k]) % nranks, sent[1])
    ranks = np.arange(nranks)
    chunk_of = np.array([c for c, _ in place], dtype=np.int64)[:, None]
    offset_of = np.array([o for _, o in place], dtype=np.int64)[:, None]
    return np.minimum(segment or max(count, 1), lengths[(chunk_of + ranks) % nranks] - offset_of)


def turned_programs(template: tuple, nranks: int, count: int, segment: int, itemsize: int = 4) -> list[tuple] | None:
    """Every rank's program, for the event simulation, from rank 0's (built with regions) for a
    schedule in algorithms.TURNING with no chunk empty (count >= nranks; segment in elements): the
    peers turned, each op's size that of the chunk it falls on there, the rest shared, which also keeps
    the simulation's working set small. Where chunks differ by an element, a rank's own program may
    list more dependencies than the turned one (regions of different lengths in one receive slot
    overlap differently), but only ones that a chain of others already implies: each op is released by
    the same op finishing, so both simulate alike (tests compare them). None where some chunk is empty,
    rank 0's regions are not whole chunks or segments of them, or chunks split into different numbers
    of segments."""
    if count < nranks:
        return None
    elements = turned_sizes(template, nranks, count, segment)
    if elements is None:
        return None
    kinds, peers, sizes, dependents, channel_next, initial_pending, channels = template[:7]
    turned_sizes_of = None
    if count % nranks:  # a few distinct sizes: one int object each, shared, not one per op and rank
        values, which = np.unique(elements.T * itemsize, return_inverse=True)
        turned_sizes_of = np.array(values.tolist(), dtype=object)[which.reshape(nranks, -1)].tolist()
    return [(kinds, [None if peer is None else (peer + rank) % nranks for peer in peers],
             sizes if turned_sizes_of is None else turned_sizes_of[rank], dependents, channel_next, initial_pending,
             {(kind, (peer + rank) % nranks): indices for (kind, peer), indices in channels.items()}, None)
            for rank in range(nranks)]


def _one_peer_each_way(channels: dict) -> bool:
    """Whether a program's messages go to one peer and come from one, so each port serves one channel."""
    return all(len({peer for kind, peer in channels if kind == way}) <= 1 for way in (SEND, RECV))


def _segments_agree(nranks: int, count: int, segment: int) -> bool:
    """Whether every chunk that is not empty splits into the same number of segments (segment in
    elements, 0: none)."""
    return not segment or len({-(-length // segment) for _, length in even_chunks(count, nranks) if length}) <= 1


def _run_turned(program, algorithm, nranks, nbytes, count, itemsize, segment, segment_elements, alpha, beta, gamma,
                overhead, eager_limit, alpha_rendezvous, built_for=None) -> SimResult | None:
    """simulate() for a schedule in algorithms.TURNING: every rank's op k at once, from rank 0's
    program built for `built_for` elements (default `count`). None where the event simulation might
    serve some resource in another order (it then runs instead)."""
    kinds, peers, _, dependents, channel_next, initial_pending, channels = program[:7]
    if not _one_peer_each_way(channels):
        return None  # a port with two channels serves them in an order that depends on the times
    elements = turned_sizes(program, nranks, count, segment_elements, built_for)
    if elements is None:
        return None
    partner = _turned_partners(program, nranks)
    sizes, present = elements * itemsize, elements > 0
    if eager_limit is None:
        eager_limit, alpha_rendezvous = float("inf"), alpha
    ops = len(kinds)
    waits_for: list[list[int]] = [[] for _ in range(ops)]
    for k, following in enumerate(dependents):
        for d in following:
            waits_for[d].append(k)
    before_on_channel = [-1] * ops
    for k, following in enumerate(channel_next):
        if following >= 0:
            before_on_channel[following] = k
    before_on_processor, last = [-1] * ops, -1
    for k in range(ops):
        if kinds[k] >= REDUCE:
            before_on_processor[k], last = last, k

    # Two nodes per op, its ready time (2k) and its finish time (2k + 1), in an order that has every
    # node's inputs first.
    unlocks: list[list[int]] = [[] for _ in range(2 * ops)]
    needs = [0] * (2 * ops)
    for k in range(ops):
        inputs = [2 * d + 1 for d in waits_for[k]] + ([2 * before_on_channel[k]] if before_on_channel[k] >= 0 else [])
        if kinds[k] >= REDUCE:
            finish_inputs = [2 * k] + ([2 * before_on_processor[k] + 1] if before_on_processor[k] >= 0 else [])
        elif kinds[k] == SEND:
            finish_inputs = [2 * k, 2 * partner[k]] + ([2 * before_on_channel[k] + 1] if before_on_channel[k] >= 0
                                                        else [])
        else:
            finish_inputs = [2 * partner[k] + 1, 2 * k]
        for node, inputs_of in ((2 * k, inputs), (2 * k + 1, finish_inputs)):
            needs[node] = len(inputs_of)
            for source in inputs_of:
                unlocks[source].append(node)
    if any(initial_pending[k] != len(waits_for[k]) + (before_on_channel[k] >= 0) for k in range(ops)):
        return None

    # An op left out on a rank (its chunk empty there) takes no time and no resource there: its ready
    # time passes on to what waits for it, and the resource's free time passes on to the next op.
    ready: list = [None] * ops
    finish: list = [None] * ops
    free: list = [None] * ops  # when the op's port or processor is free again after it
    last_ready: list = [None] * ops  # a processor op's ready time, or the last present one's before it
    start_time = np.full(nranks, float(overhead))
    never = np.full(nranks, -np.inf)
    in_order = True
    todo = deque(node for node in range(2 * ops) if needs[node] == 0)
    computed = 0
    while todo:
        node = todo.popleft()
        computed += 1
        k = node >> 1
        here = present[k]
        if not node & 1:
            value = start_time
            for d in waits_for[k]:
                value = np.maximum(value, finish[d])
            if before_on_channel[k] >= 0:
                value = np.maximum(value, ready[before_on_channel[k]])
            ready[k] = value
        elif kinds[k] >= REDUCE:
            before = before_on_processor[k]
            free_before = start_time if before < 0 else free[before]
            ready_before = never if before < 0 else last_ready[before]
            in_order = in_order and bool(np.all(ready[k][here] > ready_before[here]))
            done = np.maximum(ready[k], free_before) + gamma * sizes[k]
            finish[k] = np.where(here, done, ready[k])
            free[k] = np.where(here, done, free_before)
            last_ready[k] = np.where(here, ready[k], ready_before)
        elif kinds[k] == SEND:  # the receive at rank r + peer: its vector turned back by the peer's distance
            before = before_on_channel[k]
            free_before = start_time if before < 0 else free[before]
            start = np.maximum(np.maximum(ready[k], np.roll(ready[partner[k]], -peers[k])), free_before)
            done = (start + np.where(sizes[k] <= eager_limit, alpha, alpha_rendezvous)) + beta * sizes[k]
            finish[k] = np.where(here, done, ready[k])
            free[k] = np.where(here, done, free_before)
        else:  # a receive at rank r from r + peer ends when that rank's send does
            finish[k] = np.where(here, np.roll(finish[partner[k]], -peers[k]), ready[k])
        for following in unlocks[node]:
            needs[following] -= 1
            if not needs[following]:
                todo.append(following)
    if computed < 2 * ops or not in_order:
        return None  # a processor might serve its ops in another order than the program's

    rank_finish = np.full(nranks, float(overhead))
    for k in range(ops):
        rank_finish = np.maximum(rank_finish, np.where(present[k], finish[k], -np.inf))
    counted = sizes * present
    totals = {kind: counted[[k for k in range(ops) if kinds[k] == kind]].sum(axis=0) for kind in (SEND, RECV, REDUCE)}
    messages = {kind: present[[k for k in range(ops) if kinds[k] == kind]].sum(axis=0) for kind in (SEND, RECV)}
    return SimResult(algorithm, nranks, nbytes, itemsize, segment, float(rank_finish.max()),
                     tuple(map(float, rank_finish)), tuple(map(int, totals[SEND])), tuple(map(int, totals[RECV])),
                     tuple(map(int, messages[SEND])), tuple(map(int, messages[RECV])), tuple(map(int, totals[REDUCE])))


def _run_periodic(algorithm, nranks, period, nbytes, count, itemsize, segment, segment_elements, window, alpha, beta,
                  gamma, overhead, eager_limit, alpha_rendezvous, blocking=False) -> SimResult | None:
    """simulate() for a schedule in algorithms.PERIOD: turning the ranks by `period` maps the system onto
    itself, and where each port serves one channel (full duplex, one peer each way) no tie between ranks
    decides an order, so ranks r and r + period run alike. The first `period` ranks, each peer p as
    p mod period, then stand for all. None where that does not hold (every rank is simulated instead)."""
    folded = []
    for program in rank_programs(algorithm, nranks, count, segment_elements, window, itemsize, ranks=period,
                                 blocking=blocking):
        if not _one_peer_each_way(program[6]):
            return None
        channels = {}
        for (kind, peer), indices in program[6].items():
            if (kind, peer % period) in channels:
                return None
            channels[kind, peer % period] = indices
        folded.append((program[0], [None if peer is None else peer % period for peer in program[1]], *program[2:6],
                       channels, program[7]))
    result = run_programs(folded, algorithm, period, nbytes, itemsize, segment, alpha, beta, gamma, overhead,
                          eager_limit=eager_limit, alpha_rendezvous=alpha_rendezvous)
    return SimResult(algorithm, nranks, nbytes, itemsize, segment, result.time,
                     *(tuple(values[r % period] for r in range(nranks))
                       for values in (result.finish, result.bytes_sent, result.bytes_received, result.messages_sent,
                                      result.messages_received, result.bytes_reduced)))


def rank_programs(algorithm: str, nranks: int, count: int, segment: int = 0, window: int = 4,
                  itemsize: int = 4, regions: bool = False, ranks: int | None = None,
                  progress: bool = False, blocking: bool = False) -> list[tuple]:
    """Each rank's schedule (of the first `ranks`, default all) in the compact form the simulation runs
    (segment in elements; `blocking`: in steps, as simulate's). Building them is most of the work at
    many ranks; run_programs can run them again with other costs. `progress`: a progress bar on
    stderr, where that is a terminal."""
    jobs = [(algorithm, nranks, rank, count, segment, window, itemsize, regions, blocking)
            for rank in range(ranks or nranks)]
    workers = min(os.cpu_count() or 1, 8)
    # Forked workers inherit the collector switched off.
    with _without_gc(), _bar(progress, len(jobs), "building schedules", "rank") as bar:
        if len(jobs) < PARALLEL_FROM_RANKS or workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
            return list(_counted(map(_program, jobs), bar))
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(_counted(pool.map(_program, jobs, chunksize=max(1, len(jobs) // (4 * workers))), bar))


def _bar(shown: bool, total: int, what: str, unit: str):
    """A tqdm progress bar on stderr where `shown` and stderr is a terminal; else one that shows nothing."""
    from tqdm import tqdm
    return tqdm(total=total, desc=what, unit=unit, leave=False, disable=None if shown else True)


def _counted(items, bar):
    for item in items:
        bar.update()
        yield item


@contextlib.contextmanager
def _without_gc():
    """Python's cycle collector would walk the millions of live tuples of a large simulation again
    and again, and they hold no cycles: off while building and running (a fifth off the time of a
    1024-rank ring)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _program(job: tuple) -> tuple:
    algorithm, nranks, rank, count, segment, window, itemsize, with_regions, blocking = job
    schedule = ALGORITHMS[algorithm](nranks, rank, count)
    if segment:
        schedule = segmented(schedule, segment, window)
    if blocking:
        schedule = in_steps(schedule)
    flow = dataflow(schedule)
    ops = schedule.ops
    channels: dict[tuple[int, int], list[int]] = {}  # (SEND or RECV, peer) -> its messages' indices, in order
    for i, op in enumerate(ops):
        if op.peer is not None:
            channels.setdefault((_KIND[op.kind], op.peer), []).append(i)
    return (bytes(_KIND[op.kind] for op in ops), [op.peer for op in ops],
            [op.regions[0].count * itemsize for op in ops], flow.dependents, flow.channel_next,
            flow.initial_pending, channels,
            [op.src if op.kind is OpKind.SEND else op.dst for op in ops] if with_regions else None)


def run_programs(programs, algorithm, nranks, nbytes, itemsize, segment, alpha, beta, gamma, overhead=0.0,
                 trace=False, eager_limit=None, alpha_rendezvous=None, duplex=True, progress=False,
                 setup=0.0) -> SimResult:
    """simulate()'s second half: run programs from rank_programs with these costs."""
    with _without_gc(), _bar(progress, sum(len(p[0]) for p in programs), "simulating", "op") as bar:
        return _run(programs, algorithm, nranks, nbytes, itemsize, segment, alpha, beta, gamma, overhead, trace,
                    eager_limit, alpha_rendezvous, duplex, bar, setup)


# Events between two updates of the progress bar: often enough to see, rarely enough to cost nothing.
PROGRESS_EVERY_EVENTS = 1 << 16


def _run(programs, algorithm, nranks, nbytes, itemsize, segment, alpha, beta, gamma, overhead, trace, eager_limit,
         alpha_rendezvous, duplex, bar, setup=0.0) -> SimResult:
    if eager_limit is None:
        eager_limit, alpha_rendezvous = float("inf"), alpha
    kinds = [p[0] for p in programs]
    # Every op's data and state are kept op by op across the ranks: op i of rank r at i * nranks + r.
    # The ranks move through their ops at about the same pace, so an event touches a few pages rather
    # than one per rank (kept rank by rank, one port per rank at 1024 ranks ran 42 s rather than 25).
    lengths = [len(k) for k in kinds]
    flat = max(lengths, default=0) * nranks
    kind_of = bytearray(flat)
    pending = [0] * flat  # counted down here; the programs stay reusable
    peer_of, size_of, dependents_of, next_of, partner_of = [0] * flat, [0] * flat, [()] * flat, [0] * flat, [0] * flat
    for r, (program, partners) in enumerate(zip(programs, _partners(programs, algorithm))):
        end = lengths[r] * nranks
        kind_of[r:end:nranks] = program[0]
        peer_of[r:end:nranks] = program[1]
        size_of[r:end:nranks] = program[2]
        dependents_of[r:end:nranks] = program[3]
        next_of[r:end:nranks] = program[4]
        pending[r:end:nranks] = program[5]
        partner_of[r:end:nranks] = partners
    posted = bytearray(flat)
    started = bytearray(flat)  # messages, by their send
    start = [0.0] * flat if trace else None
    finish = [0.0] * flat
    done = [0] * nranks
    cpu_busy, send_busy, recv_busy = [False] * nranks, [False] * nranks, [False] * nranks
    in_setup = [False] * nranks
    cpu_queue = [deque() for _ in range(nranks)]
    send_queue = [deque() for _ in range(nranks)]  # ready messages waiting for a port, by their send (s, j)
    recv_queue = [deque() for _ in range(nranks)]
    if not duplex:  # one port per rank: sending and receiving take the same one, and wait in one line
        recv_busy, recv_queue = send_busy, send_queue
    events: list[tuple[float, int, int, int]] = []  # (finish time, tie-break, rank, op): a reduction, or a message by its send
    tick = itertools.count()
    push, pop = heapq.heappush, heapq.heappop
    now = overhead  # every rank starts after its call's fixed cost
    ready = deque((r, i) for r, program in enumerate(programs) for i, waiting in enumerate(program[5]) if not waiting)

    def start_message(s: int, j: int) -> None:
        g = j * nranks + s
        r = peer_of[g]
        started[g] = 1
        send_busy[s] = recv_busy[r] = True
        if setup:
            in_setup[s] = in_setup[r] = True
            push(events, (now + setup, next(tick), s, -1 - r))
        if trace:
            start[g] = start[partner_of[g] * nranks + r] = now
        size = size_of[g]
        push(events, (now + (alpha if size <= eager_limit else alpha_rendezvous) + beta * size, next(tick), s, j))

    def serve(queue: deque) -> None:
        """Start the first waiting message whose other port is free too."""
        while queue and started[queue[0][1] * nranks + queue[0][0]]:
            queue.popleft()
        for s, j in queue:
            g = j * nranks + s
            if not (started[g] or send_busy[s] or recv_busy[peer_of[g]] or in_setup[s] or in_setup[peer_of[g]]):
                start_message(s, j)
                return

    def finished(r: int, i: int) -> None:
        finish[i * nranks + r] = now
        done[r] += 1
        for d in dependents_of[i * nranks + r]:
            g = d * nranks + r
            pending[g] -= 1
            if not pending[g]:
                ready.append((r, d))

    popped = 0
    while True:
        while ready:  # everything that became ready at `now`
            r, i = ready.popleft()
            g = i * nranks + r
            kind = kind_of[g]
            if kind >= REDUCE:
                if cpu_busy[r]:
                    cpu_queue[r].append(i)
                else:
                    cpu_busy[r] = True
                    if trace:
                        start[g] = now
                    push(events, (now + gamma * size_of[g], next(tick), r, i))
                continue
            following = next_of[g]
            if following >= 0:  # the next message on this channel may be posted now
                pending[following * nranks + r] -= 1
                if not pending[following * nranks + r]:
                    ready.append((r, following))
            q, k = peer_of[g], partner_of[g]
            if not posted[k * nranks + q]:
                posted[g] = 1
                continue
            s, d, j = (r, q, i) if kind == SEND else (q, r, k)  # sender, receiver, the send's op
            if send_busy[s] or recv_busy[d] or in_setup[s] or in_setup[d]:
                send_queue[s].append((s, j))
                recv_queue[d].append((s, j))
            else:
                start_message(s, j)
        if not events:
            break
        popped += 1
        if not popped % PROGRESS_EVERY_EVENTS:
            bar.update(sum(done) - bar.n)
        now, _, r, i = pop(events)
        if i < 0:  # a message's setup is over: both its ranks may start another
            q = -1 - i
            in_setup[r] = in_setup[q] = False
            for x in (r, q):
                serve(send_queue[x])
                serve(recv_queue[x])
            continue
        g = i * nranks + r
        if kind_of[g] == SEND:
            q = peer_of[g]
            send_busy[r] = recv_busy[q] = False
            finished(r, i)
            finished(q, partner_of[g])
            serve(send_queue[r])
            serve(recv_queue[q])
        else:
            cpu_busy[r] = False
            finished(r, i)
            if cpu_queue[r]:
                following = cpu_queue[r].popleft()
                cpu_busy[r] = True
                if trace:
                    start[following * nranks + r] = now
                push(events, (now + gamma * size_of[following * nranks + r], next(tick), r, following))

    stuck = [(r, lengths[r] - done[r]) for r in range(nranks) if done[r] < lengths[r]]
    if stuck:
        raise RuntimeError(f"{algorithm} on {nranks} ranks cannot finish: (rank, ops left) {stuck[:8]}")

    volume = [[0, 0, 0, 0] for _ in range(nranks)]  # per rank, bytes per kind of op: one pass over them all
    for r, program in enumerate(programs):
        for kind, size in zip(program[0], program[2]):
            volume[r][kind] += size

    rank_finish = tuple(max(finish[r:lengths[r] * nranks:nranks], default=overhead) for r in range(nranks))
    trace_events = None
    if trace:
        trace_events = tuple(sorted(
            (Event(r, i, KIND_NAMES[kinds[r][i]], peer_of[i * nranks + r], start[i * nranks + r],
                   finish[i * nranks + r], programs[r][7][i])
             for r in range(nranks) for i in range(lengths[r])),
            key=lambda e: (e.start, e.rank, e.index)))
    return SimResult(algorithm, nranks, nbytes, itemsize, segment, max(rank_finish), rank_finish,
                     tuple(v[SEND] for v in volume), tuple(v[RECV] for v in volume),
                     tuple(k.count(SEND) for k in kinds), tuple(k.count(RECV) for k in kinds),
                     tuple(v[REDUCE] for v in volume), trace_events)


def _partners(programs: list[tuple], algorithm: str) -> list[list[int]]:
    """A message's other end: the k-th send s->r meets the k-th receive at r from s."""
    partner = [[-1] * len(program[0]) for program in programs]
    for s, program in enumerate(programs):
        for (kind, r), send_indices in program[6].items():
            if kind != SEND:
                continue
            receive_indices = programs[r][6].get((RECV, s), [])
            if len(receive_indices) != len(send_indices):
                raise RuntimeError(f"{algorithm}: rank {s} sends {len(send_indices)} messages to rank {r}, "
                                   f"which receives {len(receive_indices)} from it")
            for j, i in zip(send_indices, receive_indices):
                partner[s][j], partner[r][i] = i, j
    return partner


# Above this many lines of ranks with the same traffic, the table gives each column's range instead.
MAX_LINES = 16


def add_arguments(parser) -> None:
    from .cli import at_least, parse_size
    parser.add_argument("--algorithm", required=True, choices=sorted(ALGORITHMS))
    parser.add_argument("--ranks", type=at_least(1), required=True)
    parser.add_argument("--bytes", type=at_least(0, parse_size), required=True, help="message size, e.g. 8, 4K, 1MiB, 1G")
    parser.add_argument("--itemsize", type=at_least(1), default=4, help="bytes per element (default 4, float32)")
    parser.add_argument("--segment", type=at_least(0, parse_size), default=0, help="pipeline segments of this many bytes")
    parser.add_argument("--calibration", help="α, β, γ from a file written by python -m ringtree calibrate "
                                              "(default: the values fitted on a 2-core VM, as the selector's fallback)")
    for name, meaning in (("alpha", "seconds per message"), ("beta", "seconds per byte sent"),
                          ("gamma", "seconds per byte reduced"), ("overhead", "seconds per call"),
                          ("alpha_rendezvous", "seconds per message above --eager-limit"),
                          ("setup", "seconds a message holds both its ranks at its start")):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, help=f"{meaning} (overrides the calibration)")
    parser.add_argument("--eager-limit", type=at_least(0, parse_size), help="bytes: larger messages take --alpha-rendezvous")
    parser.add_argument("--blocking", action="store_true",
                        help="each rank's ops a step at a time, as a blocking call runs an unsegmented schedule "
                             "up to the selector's BLOCKING_MAX_BYTES")
    parser.add_argument("--duplex", action=argparse.BooleanOptionalAction,
                        help="a send and a receive port per rank (the default), or --no-duplex: one port for both")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> SimResult:
    import json
    from .cli import format_size
    from .calibrate import load
    from .selector import FALLBACK_MODEL

    params = load(args.calibration) if args.calibration else {**FALLBACK_MODEL._asdict(), "overhead": 0.0,
                                                              "eager_limit": None, "alpha_rendezvous": None,
                                                              "duplex": True, "setup": 0.0}
    params.update({name: getattr(args, name) for name in params if getattr(args, name) is not None})
    try:
        result = simulate(args.algorithm, args.ranks, args.bytes, itemsize=args.itemsize, segment=args.segment,
                          blocking=args.blocking, progress=True, **params)
    except ValueError as error:
        raise SystemExit(f"simulate: {error}") from None
    n, k = args.ranks, args.bytes
    ideal = 2 * (n - 1) * k / n
    rounding = ("exact: every chunk holds the same whole number of elements" if (k // args.itemsize) % n == 0 else
                f"chunks hold whole {args.itemsize}-byte elements and differ by one, so a rank's bytes may differ "
                f"from it by up to 2(N-1)·{args.itemsize} = {2 * (n - 1) * args.itemsize} B")
    if args.json:
        summary = {key: value for key, value in vars(result).items() if key != "events"}
        summary.update(params=params, ring_ideal_bytes_per_rank=ideal, rounding=rounding)
        print(json.dumps(summary, indent=1))
        return result
    print(f"# {args.algorithm}, {n} ranks, {format_size(k)} ({k // args.itemsize} elements of {args.itemsize} B)"
          + (f", segments of {format_size(args.segment)}" if args.segment else "")
          + (", a step at a time" if args.blocking else "")
          + f"; alpha {params['alpha']:.3g} s, beta {params['beta']:.3g} s/B, gamma {params['gamma']:.3g} s/B, "
          f"overhead {params['overhead']:.3g} s"
          + (f", above {params['eager_limit']} B alpha {params['alpha_rendezvous']:.3g} s" if params['eager_limit'] is not None
             else "") + ("" if params["duplex"] else ", one port per rank")
          + (f", setup {params['setup']:.3g} s" if params["setup"] else ""))
    print(f"predicted time: {result.time * 1e6:.2f} us; total bytes sent {sum(result.bytes_sent)}, "
          f"messages {sum(result.messages_sent)}")
    print(f"{'ranks':>12} {'bytes sent':>14} {'bytes recvd':>14} {'msgs sent':>10} {'msgs recvd':>10} "
          f"{'bytes reduced':>14} {'done at us':>11}")
    rows = list(zip(result.bytes_sent, result.bytes_received, result.messages_sent, result.messages_received,
                    result.bytes_reduced))
    groups, first = [], 0
    for r in range(1, n + 1):  # consecutive ranks with the same traffic share a line
        if r == n or rows[r] != rows[first]:
            groups.append((f"{first}" if r - 1 == first else f"{first}-{r - 1}", rows[first],
                           max(result.finish[first:r])))
            first = r
    summarized = len(groups) > MAX_LINES
    if summarized:  # e.g. uneven chunks: ranks differ by an element or so, and the range says enough
        columns = list(zip(*rows)) + [result.finish]
        low, high = [min(c) for c in columns], [max(c) for c in columns]
        groups = [(f"min of {n}", low[:5], low[5]), (f"max of {n}", high[:5], high[5])]
    for ranks, row, done in groups:
        print(f"{ranks:>12} {row[0]:>14} {row[1]:>14} {row[2]:>10} {row[3]:>10} {row[4]:>14} {done * 1e6:>11.2f}")
    if summarized:
        print(f"(each column's smallest and largest over the {n} ranks; --json lists every rank)")
    if args.algorithm == "ring":
        print(f"ring's ideal per-rank share 2(N-1)/N·K = {ideal:.1f} B; {rounding}")
    return result
