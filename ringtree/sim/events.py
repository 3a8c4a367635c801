"""The event simulation: every rank's flat schedule, run as discrete events under the α-β-γ costs.

A message starts once its send and its receive are both posted and its ports
are free (and neither rank is in another message's setup; and, between nodes, the
sender's node's link out and the receiver's node's link in are free); a reduction or copy
once its rank's processor is free. Whatever waits for a port or the processor
gets it in the order it became ready, ties in schedule order. Every op's data
and state are kept op by op across the ranks, op i of rank r at i·N + r: the
ranks move through their ops at about the same pace, so an event touches a
few pages rather than one per rank.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import NamedTuple

from ..schedule import OpKind
from .flat import FlatSchedule, partners, progress_bar, without_gc
from .result import Call, Costs, Event, SimResult

__all__ = ["run_events"]

SEND, RECV, REDUCE = int(OpKind.SEND), int(OpKind.RECV), int(OpKind.REDUCE)
# Events between two updates of the progress bar: often enough to see, rarely enough to cost nothing.
PROGRESS_EVERY_EVENTS = 1 << 16


def run_events(schedules: list[FlatSchedule], call: Call, costs: Costs, trace: bool = False,
               progress: bool = False, node_of: tuple[int, ...] | None = None) -> SimResult:
    """Simulate `call` from every rank's flat schedule (flat_schedules) with these costs; `node_of`,
    each rank's node, where messages between nodes cost costs.between_nodes and take the nodes' links."""
    with without_gc(), progress_bar(progress, sum(len(s.kinds) for s in schedules), "simulating", "op") as bar:
        ops = _Ops.of(schedules, call.algorithm, call.nranks)
        start, finish, done = _simulate(ops, costs, trace, bar, node_of)
        bar.update(sum(done) - bar.n)  # the last state shown is the end
        return _result(schedules, ops, call, costs, start, finish, done)


class _Ops(NamedTuple):
    """Every rank's ops, op i of rank r at i·N + r."""

    nranks: int
    lengths: list[int]
    kind: bytearray
    peer: list
    size: list
    dependents: list
    next_on_channel: list
    partner: list
    pending: list  # counted down by a simulation: built anew for each

    @classmethod
    def of(cls, schedules: list[FlatSchedule], algorithm: str, nranks: int) -> _Ops:
        lengths = [len(s.kinds) for s in schedules]
        flat = max(lengths, default=0) * nranks
        ops = cls(nranks, lengths, bytearray(flat), [0] * flat, [0] * flat, [()] * flat, [0] * flat, [0] * flat,
                  [0] * flat)
        for r, (schedule, partner) in enumerate(zip(schedules, partners(schedules, algorithm))):
            end = lengths[r] * nranks
            ops.kind[r:end:nranks] = schedule.kinds
            ops.peer[r:end:nranks] = schedule.peers
            ops.size[r:end:nranks] = schedule.sizes
            ops.dependents[r:end:nranks] = schedule.dependents
            ops.next_on_channel[r:end:nranks] = schedule.channel_next
            ops.pending[r:end:nranks] = schedule.initial_pending
            ops.partner[r:end:nranks] = partner
        return ops


def _simulate(ops: _Ops, costs: Costs, trace: bool, bar, node_of) -> tuple[list | None, list, list[int]]:
    """(start times where traced, finish times, ops done per rank)."""
    nranks, kind_of, peer_of, size_of, pending = ops.nranks, ops.kind, ops.peer, ops.size, ops.pending
    next_of, partner_of = ops.next_on_channel, ops.partner
    gamma = costs.gamma
    ports = _ports(ops, costs, trace, node_of)
    post, free, serve_after = ports.post, ports.free, ports.serve_after
    done = [0] * nranks
    cpu_busy = [False] * nranks
    cpu_queue = [deque() for _ in range(nranks)]
    events, tick, push, pop = ports.events, ports.tick, heapq.heappush, heapq.heappop
    finish, start = ports.finish, ports.start
    dependents_of = ops.dependents
    now = costs.overhead  # every rank starts after its call's fixed cost
    ready = deque((r, i) for r in range(nranks) for i in range(ops.lengths[r]) if not pending[i * nranks + r])

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
            if kind_of[g] >= REDUCE:
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
            post(r, i, g, now)
        if not events:
            return start, finish, done
        popped += 1
        if not popped % PROGRESS_EVERY_EVENTS:
            bar.update(sum(done) - bar.n)
        now, _, r, i = pop(events)
        if i < 0:  # a message's setup is over: both its ranks may start another
            ports.setup_over(r, -1 - i, now)
            continue
        g = i * nranks + r
        if kind_of[g] == SEND:
            q = peer_of[g]
            free(r, q)
            finished(r, i)
            finished(q, partner_of[g])
            serve_after(r, q, now)
        else:
            cpu_busy[r] = False
            finished(r, i)
            if cpu_queue[r]:
                following = cpu_queue[r].popleft()
                cpu_busy[r] = True
                if trace:
                    start[following * nranks + r] = now
                push(events, (now + gamma * size_of[following * nranks + r], next(tick), r, following))


class _Ports(NamedTuple):
    """The ranks' send and receive ports (one port for both with duplex=False), the messages waiting
    for them, and the event queue: (finish time, tie-break, rank, op) for a reduction, a message by
    its send, or (op -1 - peer) the end of a message's setup. Closures over lists, not methods over
    attributes: they run once or more per event."""

    events: list
    tick: itertools.count
    start: list | None
    finish: list
    post: object  # (rank, op, its index g, now): start the message if its other end is posted and free
    free: object  # (sender, receiver): a message between them ended
    serve_after: object  # (sender, receiver, now): start what waits for their ports
    setup_over: object  # (sender, receiver, now)


class _Links:
    """Each node's one link out and one link in: a message between nodes holds both its nodes' links
    that way, and costs costs.between_nodes. With costs.link_burst, each link is a token bucket (as
    tc's tbf): up to that many bytes, refilled at the link's rate, pass at the speed within a node.
    Without nodes told apart, every rank is on node 0."""

    def __init__(self, costs: Costs, node_of, nranks: int) -> None:
        split = node_of is not None and costs.between_nodes is not None and len(set(node_of)) > 1
        self.node = list(node_of) if split else [0] * nranks
        self.alpha, self.beta = costs.between_nodes if split else (costs.alpha, costs.beta)
        self.fast, self.burst = costs.beta, costs.link_burst
        nodes = max(self.node) + 1
        self.out, self.into = [False] * nodes, [False] * nodes
        self.on_node = [[r for r in range(nranks) if self.node[r] == n] for n in range(nodes)]
        # per node and way: the bucket's bytes, and when they were counted
        self.tokens = {way: [0.0] * nodes for way in ("out", "in")}
        self.counted = {way: [0.0] * nodes for way in ("out", "in")}

    def hold(self, sender: int, receiver: int, held: bool) -> None:
        """Take (or free) the links a message from `sender` to `receiver` needs, if any."""
        if self.node[sender] != self.node[receiver]:
            self.out[self.node[sender]] = self.into[self.node[receiver]] = held

    def duration(self, sender: int, receiver: int, size: int, now: float) -> float:
        """How long a message between nodes, starting `now`, takes: the slower of its two links."""
        if not self.burst:
            return self.alpha + self.beta * size
        return self.alpha + max(self._drain("out", self.node[sender], size, now),
                                self._drain("in", self.node[receiver], size, now))

    def _drain(self, way: str, node: int, size: int, now: float) -> float:
        tokens, counted = self.tokens[way], self.counted[way]
        available = min(self.burst, tokens[node] + (now - counted[node]) / self.beta)
        fast = min(size, available)
        seconds = fast * self.fast + (size - fast) * self.beta
        tokens[node], counted[node] = available - fast, now + (seconds if fast < size else 0.0)
        return seconds


def _ports(ops: _Ops, costs: Costs, trace: bool, node_of) -> _Ports:
    nranks, kind_of, peer_of, partner_of, size_of = ops.nranks, ops.kind, ops.peer, ops.partner, ops.size
    alpha, beta, setup = costs.alpha, costs.beta, costs.setup
    eager_limit = float("inf") if costs.eager_limit is None else costs.eager_limit
    alpha_rendezvous = alpha if costs.alpha_rendezvous is None else costs.alpha_rendezvous
    flat = len(kind_of)
    posted, started = bytearray(flat), bytearray(flat)  # started: messages, by their send
    start, finish = [0.0] * flat if trace else None, [0.0] * flat
    send_busy, recv_busy, in_setup = [False] * nranks, [False] * nranks, [False] * nranks
    send_queue = [deque() for _ in range(nranks)]  # ready messages waiting for a port, by their send (s, j)
    recv_queue = [deque() for _ in range(nranks)]
    if not costs.duplex:  # one port per rank: sending and receiving take the same one, and wait in one line
        recv_busy, recv_queue = send_busy, send_queue
    links = _Links(costs, node_of, nranks)
    node, link_out, link_in = links.node, links.out, links.into
    events: list[tuple[float, int, int, int]] = []
    tick = itertools.count()
    push = heapq.heappush

    def blocked(s: int, d: int) -> bool:
        return (send_busy[s] or recv_busy[d] or in_setup[s] or in_setup[d]
                or (node[s] != node[d] and (link_out[node[s]] or link_in[node[d]])))

    def start_message(s: int, j: int, now: float) -> None:
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
        links.hold(s, r, True)
        if node[s] != node[r]:
            push(events, (now + links.duration(s, r, size, now), next(tick), s, j))
        else:
            push(events, (now + (alpha if size <= eager_limit else alpha_rendezvous) + beta * size, next(tick), s, j))

    def serve(queue: deque, now: float) -> None:
        """Start the first waiting message whose other port (and links) are free too."""
        while queue and started[queue[0][1] * nranks + queue[0][0]]:
            queue.popleft()
        for s, j in queue:
            g = j * nranks + s
            if not (started[g] or blocked(s, peer_of[g])):
                start_message(s, j, now)
                return

    def post(r: int, i: int, g: int, now: float) -> None:
        q, k = peer_of[g], partner_of[g]
        if not posted[k * nranks + q]:
            posted[g] = 1
            return
        s, d, j = (r, q, i) if kind_of[g] == SEND else (q, r, k)  # sender, receiver, the send's op
        if blocked(s, d):
            send_queue[s].append((s, j))
            recv_queue[d].append((s, j))
        else:
            start_message(s, j, now)

    def free(s: int, r: int) -> None:
        send_busy[s] = recv_busy[r] = False
        links.hold(s, r, False)

    def serve_after(s: int, r: int, now: float) -> None:
        serve(send_queue[s], now)
        serve(recv_queue[r], now)
        if node[s] != node[r]:  # the links are free: whatever waited for them on either node
            for queue in [send_queue[x] for x in links.on_node[node[s]]] + [recv_queue[x] for x in links.on_node[node[r]]]:
                serve(queue, now)

    def setup_over(s: int, r: int, now: float) -> None:
        in_setup[s] = in_setup[r] = False
        for x in (s, r):
            serve(send_queue[x], now)
            serve(recv_queue[x], now)

    return _Ports(events, tick, start, finish, post, free, serve_after, setup_over)


def _result(schedules, ops: _Ops, call: Call, costs: Costs, start, finish, done) -> SimResult:
    nranks, lengths, algorithm = ops.nranks, ops.lengths, call.algorithm
    stuck = [(r, lengths[r] - done[r]) for r in range(nranks) if done[r] < lengths[r]]
    if stuck:
        raise RuntimeError(f"{algorithm} on {nranks} ranks cannot finish: (rank, ops left) {stuck[:8]}")
    volume = [[0, 0, 0, 0] for _ in range(nranks)]  # per rank, bytes per kind of op: one pass over them all
    for r, schedule in enumerate(schedules):
        for kind, size in zip(schedule.kinds, schedule.sizes):
            volume[r][kind] += size
    rank_finish = tuple(max(finish[r:lengths[r] * nranks:nranks], default=costs.overhead) for r in range(nranks))
    trace_events = None
    if start is not None:
        trace_events = tuple(sorted(
            (Event(r, i, str(OpKind(ops.kind[i * nranks + r])), ops.peer[i * nranks + r], start[i * nranks + r],
                   finish[i * nranks + r], schedules[r].regions[i])
             for r in range(nranks) for i in range(lengths[r])),
            key=lambda e: (e.start, e.rank, e.index)))
    return SimResult(*call, max(rank_finish), rank_finish,
                     tuple(v[SEND] for v in volume), tuple(v[RECV] for v in volume),
                     tuple(s.kinds.count(SEND) for s in schedules), tuple(s.kinds.count(RECV) for s in schedules),
                     tuple(v[REDUCE] for v in volume), trace_events)
