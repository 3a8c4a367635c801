"""The simulator's shortcuts, for schedules alike on every rank up to turning the ranks around.

`run_turned`: a schedule whose Algorithm claims `turning` is built for rank 0 alone, and
op k of every rank is simulated at once, as numpy vectors over the ranks.
`run_periodic`: a schedule whose Algorithm claims `period` is simulated on P ranks that
stand for all. Each returns None where it cannot show that it gives the event
simulation's result, which then runs instead.
"""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from ..schedule import INPUT, OUTPUT, OpKind, even_chunks
from .events import run_events
from .flat import FlatSchedule, flat_schedules
from .result import Call, Costs, SimResult

__all__ = ["run_turned", "run_periodic", "turned_sizes", "turned_schedules", "turned_partners",
           "one_peer_each_way", "segments_agree"]

SEND, RECV, REDUCE = int(OpKind.SEND), int(OpKind.RECV), int(OpKind.REDUCE)


# Rank r's op k is rank 0's op k on chunk c + r instead of c, with a peer r further on, or no op where
# that chunk is empty. So op k of every rank can be simulated at once: its ready and finish times are
# vectors over the ranks, a message's other end is its partner's vector turned by the peer's distance.


def turned_partners(template: FlatSchedule, nranks: int) -> list[int]:
    """For rank 0's messages: the index of the op at rank 0 that stands for the other end."""
    partner = [-1] * len(template.kinds)
    channels = template.channels
    for (kind, peer), send_indices in channels.items():
        if kind == SEND:
            receive_indices = channels.get((RECV, -peer % nranks), [])
            if len(receive_indices) != len(send_indices):
                raise RuntimeError(f"rank 0 sends {len(send_indices)} messages to rank {peer} but receives "
                                   f"{len(receive_indices)} from rank {-peer % nranks}: the schedule does not turn")
            for j, i in zip(send_indices, receive_indices):
                partner[j], partner[i] = i, j
    return partner


def turned_sizes(template: FlatSchedule, nranks: int, count: int, segment: int, built_for: int | None = None):
    """Rank r's op sizes in elements at `count`, as rows of an array (op, rank), 0 for an op it leaves
    out, from rank 0's flat schedule built with regions for `built_for` elements (default `count`), for a
    schedule whose Algorithm claims `turning` (segment in elements, 0 for none); None where rank 0's regions are
    not whole chunks, or segments of them, or chunks split into different numbers of segments."""
    kinds, peers, regions = template.kinds, template.peers, template.regions
    built_for = count if built_for is None else built_for
    if not segments_agree(nranks, count, segment) or not segments_agree(nranks, built_for, segment):
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
    partner = turned_partners(template, nranks)
    for k in range(len(regions)):
        if place[k] is None:  # a receive into a slot: the chunk its sender, `peer` ranks on, sends
            sent = place[partner[k]] if kinds[k] == RECV else None
            if sent is None:
                return None
            place[k] = ((sent[0] + peers[k]) % nranks, sent[1])
    ranks = np.arange(nranks)
    chunk_of = np.array([c for c, _ in place], dtype=np.int64)[:, None]
    offset_of = np.array([o for _, o in place], dtype=np.int64)[:, None]
    return np.minimum(segment or max(count, 1), lengths[(chunk_of + ranks) % nranks] - offset_of)


def turned_schedules(template: FlatSchedule, nranks: int, count: int, segment: int,
                     itemsize: int = 4) -> list[FlatSchedule] | None:
    """Every rank's flat schedule, for the event simulation, from rank 0's (built with regions) for a
    schedule whose Algorithm claims `turning` with no chunk empty (count >= nranks; segment in elements): the
    peers turned, each op's size that of the chunk it falls on there, the rest shared, which also keeps
    the simulation's working set small. Where chunks differ by an element, a rank's own schedule may
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
    kinds, peers, sizes, dependents, channel_next, initial_pending, channels, _ = template
    turned_sizes_of = None
    if count % nranks:  # a few distinct sizes: one int object each, shared, not one per op and rank
        values, which = np.unique(elements.T * itemsize, return_inverse=True)
        turned_sizes_of = np.array(values.tolist(), dtype=object)[which.reshape(nranks, -1)].tolist()
    return [FlatSchedule(kinds, [None if peer is None else (peer + rank) % nranks for peer in peers],
                         sizes if turned_sizes_of is None else turned_sizes_of[rank], dependents, channel_next,
                         initial_pending,
                         {(kind, (peer + rank) % nranks): indices for (kind, peer), indices in channels.items()}, None)
            for rank in range(nranks)]


def one_peer_each_way(channels: dict) -> bool:
    """Whether a schedule's messages go to one peer and come from one, so each port serves one channel."""
    return all(len({peer for kind, peer in channels if kind == way}) <= 1 for way in (SEND, RECV))


def segments_agree(nranks: int, count: int, segment: int) -> bool:
    """Whether every chunk that is not empty splits into the same number of segments (segment in
    elements, 0: none)."""
    return not segment or len({-(-length // segment) for _, length in even_chunks(count, nranks) if length}) <= 1


def run_turned(template: FlatSchedule, call: Call, costs: Costs, built_for: int | None = None) -> SimResult | None:
    """simulate() for a schedule whose Algorithm claims `turning`: every rank's op k at once, from rank 0's flat
    schedule built with regions for `built_for` elements (default call.count). None where the event
    simulation might serve some resource in another order (it then runs instead)."""
    nranks = call.nranks
    if not one_peer_each_way(template.channels):
        return None  # a port with two channels serves them in an order that depends on the times
    elements = turned_sizes(template, nranks, call.count, call.segment_elements, built_for)
    if elements is None:
        return None
    graph = _TimeGraph.of(template, turned_partners(template, nranks))
    if graph is None:
        return None
    sizes, present = elements * call.itemsize, elements > 0
    finish = graph.finish_times(template, nranks, sizes, present, costs)
    if finish is None:
        return None  # a processor might serve its ops in another order than the schedule's
    kinds, ops = template.kinds, len(template.kinds)
    rank_finish = np.full(nranks, float(costs.overhead))
    for k in range(ops):
        rank_finish = np.maximum(rank_finish, np.where(present[k], finish[k], -np.inf))
    counted = sizes * present
    totals = {kind: counted[[k for k in range(ops) if kinds[k] == kind]].sum(axis=0) for kind in (SEND, RECV, REDUCE)}
    messages = {kind: present[[k for k in range(ops) if kinds[k] == kind]].sum(axis=0) for kind in (SEND, RECV)}
    return SimResult(*call, float(rank_finish.max()), tuple(map(float, rank_finish)), tuple(map(int, totals[SEND])),
                     tuple(map(int, totals[RECV])), tuple(map(int, messages[SEND])), tuple(map(int, messages[RECV])),
                     tuple(map(int, totals[REDUCE])))


class _TimeGraph:
    """Two nodes per op of rank 0's schedule, its ready time (2k) and its finish time (2k + 1), with
    what each waits for, in an order that has every node's inputs first.

    This gives the event simulation's times exactly when every resource serves its ops in a fixed
    order: a rank that sends to one peer and receives from one (full duplex) has one channel per
    port, served in channel order; its processor serves reductions and copies in the order they
    become ready, which is schedule order when each is ready strictly after the one before (checked
    while the times are computed).
    """

    def __init__(self, partner, waits_for, before_on_channel, before_on_processor, unlocks, needs) -> None:
        self.partner, self.waits_for, self.unlocks, self.needs = partner, waits_for, unlocks, needs
        self.before_on_channel, self.before_on_processor = before_on_channel, before_on_processor

    @classmethod
    def of(cls, template: FlatSchedule, partner: list[int]) -> _TimeGraph | None:
        """None where an op waits for more than its dependencies and its channel's previous message."""
        kinds, ops = template.kinds, len(template.kinds)
        waits_for: list[list[int]] = [[] for _ in range(ops)]
        for k, following in enumerate(template.dependents):
            for d in following:
                waits_for[d].append(k)
        before_on_channel = [-1] * ops
        for k, following in enumerate(template.channel_next):
            if following >= 0:
                before_on_channel[following] = k
        before_on_processor, last = [-1] * ops, -1
        for k in range(ops):
            if kinds[k] >= REDUCE:
                before_on_processor[k], last = last, k
        if any(template.initial_pending[k] != len(waits_for[k]) + (before_on_channel[k] >= 0) for k in range(ops)):
            return None
        unlocks: list[list[int]] = [[] for _ in range(2 * ops)]
        needs = [0] * (2 * ops)
        for k in range(ops):
            channel = before_on_channel[k]
            inputs = [2 * d + 1 for d in waits_for[k]] + ([2 * channel] if channel >= 0 else [])
            if kinds[k] >= REDUCE:
                previous = before_on_processor[k]
                finish_inputs = [2 * k] + ([2 * previous + 1] if previous >= 0 else [])
            elif kinds[k] == SEND:
                finish_inputs = [2 * k, 2 * partner[k]] + ([2 * channel + 1] if channel >= 0 else [])
            else:
                finish_inputs = [2 * partner[k] + 1, 2 * k]
            for node, inputs_of in ((2 * k, inputs), (2 * k + 1, finish_inputs)):
                needs[node] = len(inputs_of)
                for source in inputs_of:
                    unlocks[source].append(node)
        return cls(partner, waits_for, before_on_channel, before_on_processor, unlocks, needs)

    def finish_times(self, template: FlatSchedule, nranks: int, sizes, present, costs: Costs) -> list | None:
        """Every op's finish time, a vector over the ranks; None where some processor might take its
        ops out of schedule order. An op left out on a rank (its chunk empty there) takes no time
        and no resource there: its ready time passes on to what waits for it, and the resource's
        free time to the next op."""
        kinds, peers, ops, partner = template.kinds, template.peers, len(template.kinds), self.partner
        alpha, beta, gamma = costs.alpha, costs.beta, costs.gamma
        eager_limit = float("inf") if costs.eager_limit is None else costs.eager_limit
        alpha_rendezvous = alpha if costs.alpha_rendezvous is None else costs.alpha_rendezvous
        ready, finish = [None] * ops, [None] * ops
        free = [None] * ops  # when the op's port or processor is free again after it
        last_ready = [None] * ops  # a processor op's ready time, or the last present one's before it
        start_time, never = np.full(nranks, float(costs.overhead)), np.full(nranks, -np.inf)
        needs, in_order, computed = list(self.needs), True, 0
        todo = deque(node for node in range(2 * ops) if needs[node] == 0)
        while todo:
            node = todo.popleft()
            computed += 1
            k = node >> 1
            here = present[k]
            if not node & 1:
                value = start_time
                for d in self.waits_for[k]:
                    value = np.maximum(value, finish[d])
                if self.before_on_channel[k] >= 0:
                    value = np.maximum(value, ready[self.before_on_channel[k]])
                ready[k] = value
            elif kinds[k] >= REDUCE:
                before = self.before_on_processor[k]
                free_before = start_time if before < 0 else free[before]
                ready_before = never if before < 0 else last_ready[before]
                in_order = in_order and bool(np.all(ready[k][here] > ready_before[here]))
                done = np.maximum(ready[k], free_before) + gamma * sizes[k]
                finish[k] = np.where(here, done, ready[k])
                free[k] = np.where(here, done, free_before)
                last_ready[k] = np.where(here, ready[k], ready_before)
            elif kinds[k] == SEND:  # the receive at rank r + peer: its vector turned back by the peer's distance
                before = self.before_on_channel[k]
                free_before = start_time if before < 0 else free[before]
                start = np.maximum(np.maximum(ready[k], np.roll(ready[partner[k]], -peers[k])), free_before)
                done = (start + np.where(sizes[k] <= eager_limit, alpha, alpha_rendezvous)) + beta * sizes[k]
                finish[k] = np.where(here, done, ready[k])
                free[k] = np.where(here, done, free_before)
            else:  # a receive at rank r from r + peer ends when that rank's send does
                finish[k] = np.where(here, np.roll(finish[partner[k]], -peers[k]), ready[k])
            for following in self.unlocks[node]:
                needs[following] -= 1
                if not needs[following]:
                    todo.append(following)
        return finish if computed == 2 * ops and in_order else None


def run_periodic(call: Call, period: int, costs: Costs, window: int = 4, stepwise: bool = False) -> SimResult | None:
    """simulate() for a schedule whose Algorithm claims `period`: turning the ranks by `period` maps the system onto
    itself, and where each port serves one channel (full duplex, one peer each way) no tie between ranks
    decides an order, so ranks r and r + period run alike. The first `period` ranks, each peer p as
    p mod period, then stand for all. None where that does not hold (every rank is simulated instead)."""
    folded = []
    for schedule in flat_schedules(call.algorithm, call.nranks, call.count, call.segment_elements, window,
                                   call.itemsize, ranks=period, stepwise=stepwise):
        if not one_peer_each_way(schedule.channels):
            return None
        channels = {}
        for (kind, peer), indices in schedule.channels.items():
            if (kind, peer % period) in channels:
                return None
            channels[kind, peer % period] = indices
        folded.append(schedule._replace(peers=[None if peer is None else peer % period for peer in schedule.peers],
                                        channels=channels))
    result = run_events(folded, call._replace(nranks=period), costs)
    return SimResult(*call, result.time,
                     *(tuple(values[r % period] for r in range(call.nranks))
                       for values in (result.finish, result.bytes_sent, result.bytes_received, result.messages_sent,
                                      result.messages_received, result.bytes_reduced)))
