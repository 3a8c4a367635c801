"""The progress engine: runs one rank's schedule on real buffers with nonblocking MPI.

Each op waits for a count of unfinished dependencies. An op whose count reaches
zero is issued: sends and receives are posted as Isend/Irecv at once, and
reductions and copies run after every message that is ready has been posted,
so transfers are already under way while the array library computes. Messages
to (and from) the same peer are posted in schedule order, which is what lets
the schedule rely on MPI's non-overtaking rule. All collectives in flight share
one list of requests (in_flight.py), so waiting on any of them progresses every one.

Sends to a rank on another node are synchronous, and wait for a turn (remote_sends.py).
Messages to the peers of the call's transport (IPC between GPU ranks of a node, ipc.py) are, like
queued reductions, objects whose `done` moves them on.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from mpi4py import MPI

from ...schedule import OpKind
from ..safety.mismatch import Signature
from ..safety.reliability import check_given_up
from . import timeline
from .compiled import CompiledSchedule
from .in_flight import IN_FLIGHT, LOCK

__all__ = ["Execution"]

BYTE = MPI.BYTE
SEND, RECV = OpKind.SEND, OpKind.RECV


class Execution:
    """One rank's run of one collective."""

    __slots__ = ("compiled", "actions", "buffers", "reduce", "copy", "asynchronous", "state", "comm", "seq", "tag",
                 "signature", "finish", "timeout", "pending", "remaining", "done", "computes", "failed", "transport",
                 "transport_peers", "channels", "exported", "remote", "peer_keys", "released", "copies")

    def __init__(self, compiled: CompiledSchedule, buffers: list, inplace: bool, reduce, copy,
                 state, signature: Signature, finish, timeout: float | None = None, asynchronous: bool = False,
                 transport=None) -> None:
        """`buffers`: 1-D arrays of elements, numbered as in CompiledSchedule; `inplace`: input and
        output are the same memory; `state`: the communicator's CommState. Messages go as bytes:
        [region, MPI.BYTE]. `timeout`: seconds without progress before a wait raises TimeoutError.
        `signature`: the call's (mismatch.py), in every message's tag.
        `asynchronous`: `reduce` and `copy` may return, instead of None, something whose `done` turns
        true once the work they queued has finished (a CUDA event); the ops that depend on it wait
        until then. `transport`: the call's IpcTransport, which carries the messages to
        and from its peers, or None."""
        self.compiled = compiled
        self.actions = compiled.in_place_actions if inplace else compiled.actions
        self.buffers = buffers
        self.reduce = reduce
        self.copy = copy
        self.asynchronous = asynchronous
        self.state = state
        self.comm = state.comm
        self.seq = state.calls
        self.tag = state.next_tag(signature.code)
        self.signature = signature
        self.finish = finish
        self.timeout = timeout
        self.pending = list(compiled.initial_pending)
        self.remaining = len(compiled.initial_pending)
        self.done = False
        self.failed: Exception | None = None  # the error it was abandoned with, in whichever thread's poll
        self.computes: deque[int] = deque()
        self.transport = transport
        self.transport_peers = frozenset() if transport is None else transport.peers
        self.channels: dict = {}  # per IPC peer: its ipc.Channel
        self.exported: dict = {}  # for the IPC transport: each buffer's export, looked up once per call
        self.remote, self.peer_keys = state.remote, state.peer_keys
        self.released: dict = {}  # per send to another node in flight whose dependents went on: the copy it sends
        self.copies = state.send_copies  # by size in bytes: copies of sends done, for the next ones
        IN_FLIGHT.running.add(self)
        self._run(list(compiled.first_ready))
        if self.remaining == 0:
            self._complete()

    def test(self) -> bool:
        """Whether it is done, after one poll of every collective in flight."""
        if not self.done:
            IN_FLIGHT.poll()
        if self.done and self.timeout is not None:  # its messages may have come from a rank that left it since
            check_given_up(self.state, self.seq, self.signature.collective)
        return self.done

    def wait(self) -> None:
        if not self.done:
            IN_FLIGHT.wait(self)
        if self.timeout is not None:
            check_given_up(self.state, self.seq, self.signature.collective)

    def _run(self, ready: list[int]) -> None:
        """Post every ready message; then compute one ready op, and repeat."""
        actions, computes, buffers, pending = self.actions, self.computes, self.buffers, self.pending
        channel_next, transport_peers, remote = self.compiled.channel_next, self.transport_peers, self.remote
        tracing = timeline.TIMELINE.active
        while True:
            while ready:
                i = ready.pop()
                action = actions[i]
                kind = action[0] if action is not None else None
                if kind is not SEND and kind is not RECV:
                    computes.append(i)
                    continue
                if action[1] in transport_peers:
                    IN_FLIGHT.add_queued(self._by_transport(kind, action[1], buffers[action[2]], action[3]), self, i)
                elif kind is SEND:
                    if not remote[action[1]]:
                        IN_FLIGHT.add(self.comm.Isend([buffers[action[2]][action[3]], BYTE], action[1], self.tag),
                                      self, i)
                    elif IN_FLIGHT.remote_sends.take(self.peer_keys[action[1]], self, i):
                        region = buffers[action[2]][action[3]]
                        if self.compiled.dependents[i] and type(region) is np.ndarray:
                            # A write of the region waits for the send: a copy goes, as MPI's buffering of a
                            # standard send would let it, else that write would wait for the peer's match.
                            region = self.released[i] = self._copy(region)
                            self._release(i, ready)
                        IN_FLIGHT.add(self.comm.Issend([region, BYTE], action[1], self.tag), self, i)
                    else:
                        continue  # held until a send to that rank is done; the ones after it on its channel too
                else:
                    IN_FLIGHT.add(self.comm.Irecv([buffers[action[2]][action[3]], BYTE], action[1], self.tag), self, i)
                if tracing:
                    timeline.posted(self, i)
                following = channel_next[i]
                if following >= 0:
                    pending[following] -= 1
                    if pending[following] == 0:
                        ready.append(following)
            if not computes:
                return
            i = computes.popleft()
            action = actions[i]
            start = timeline.now() if tracing else 0
            if action is None:
                queued = None  # in place: the input already is the output
            elif action[0] is OpKind.REDUCE:
                (d, ds), (a, as_), (b, bs) = action[1:]
                queued = self.reduce(buffers[a][as_], buffers[b][bs], buffers[d][ds])
            else:
                (d, ds), (s, ss) = action[1:]
                queued = self.copy(buffers[d][ds], buffers[s][ss])
            if tracing:
                timeline.computed(self, i, start)
            if self.asynchronous and queued is not None:
                IN_FLIGHT.add_queued(queued, self, i)
            else:
                self._finished(i, ready)

    def _by_transport(self, kind, peer: int, buffer, elements: slice):
        try:
            return self.transport.message(self, kind is SEND, peer, buffer, elements)
        except RuntimeError as error:  # the memory cannot be shared: this call cannot go on
            with LOCK:
                raise IN_FLIGHT.abandon(self, error) from None

    def _finished(self, i: int, ready: list[int]) -> None:
        self.remaining -= 1
        if self.released and i in self.released:
            copy = self.released.pop(i)  # its dependents went on when it was posted
            self.copies.setdefault(copy.nbytes, []).append(copy)
        else:
            self._release(i, ready)

    def _copy(self, region: np.ndarray) -> np.ndarray:
        """The bytes of `region` in a buffer of their own, one a finished send left where there is one."""
        free = self.copies.get(region.nbytes)
        copy = free.pop() if free else np.empty(region.nbytes, np.uint8)
        copy[...] = region.view(np.uint8)
        return copy

    def _release(self, i: int, ready: list[int]) -> None:
        pending = self.pending
        for d in self.compiled.dependents[i]:
            pending[d] -= 1
            if pending[d] == 0:
                ready.append(d)

    def op_done(self, i: int) -> None:
        """A message, or a queued reduction or copy, has completed."""
        action = self.actions[i]
        if timeline.TIMELINE.active and action is not None and action[0] < OpKind.REDUCE:
            timeline.completed(self, i)
        ready: list[int] = []
        self._finished(i, ready)
        if action is not None and action[0] is SEND and self.remote[action[1]] and action[1] not in self.transport_peers:
            held = IN_FLIGHT.remote_sends.done(self.peer_keys[action[1]])
            if held is not None:
                execution, op = held
                if execution is self:
                    ready.append(op)  # posted first: ready is taken from its end
                else:
                    execution.resume(op)
        if ready or self.computes:
            self._run(ready)
        if self.remaining == 0:
            self._complete()

    def resume(self, op: int) -> None:
        """Post a send that was held for its turn (RemoteSends.take), and go on from there."""
        self._run([op])

    def _complete(self) -> None:
        self.done = True
        IN_FLIGHT.running.discard(self)
        self.finish()

    def abandon(self, error: Exception) -> None:
        """Abandon this collective (InFlight.abandon) after a mismatch or a timeout."""
        with LOCK:
            IN_FLIGHT.abandon(self, error)

    def peers_waited_for(self) -> list[int]:
        """The ranks of this collective's messages in flight: whom a stall warning says it waits for."""
        ops = self.compiled.schedule.ops
        return sorted({ops[op].peer for op in IN_FLIGHT.ops_of(self)} - {None})
