"""Staging as a schedule transformation: messages leave and arrive through host memory.

An MPI that is not CUDA-aware cannot read or write device memory, so every
message of a device-buffer call goes through host memory: a send of a device
region becomes a copy into a host slot, then a send of the slot; a receive
becomes a receive into a host slot, then a copy onto the device. Reductions and
copies stay where they were, on the device.

Each channel (sends to one peer, receives from one peer) takes `window` slots
in turn, each as large as the largest message (a segment, for a segmented
schedule). The builder derives the dependencies the reuse adds: a send slot is
refilled only after the send that read it completed, a receive slot only after
its data was copied out. Both wait for an earlier message of the same channel
only, which MPI delivers first anyway: slots taken in turn across channels
instead can deadlock (the verifier finds such cases). So staging takes
channels x window x segment elements of host memory whatever the message size,
and the slots can be pinned once and reused by every call.
"""

from __future__ import annotations

from .ir import OpKind, Ref, Schedule, ScheduleBuilder

HOST = "host:"  # buffers named with this prefix live in host memory, whatever the call's arrays are
SEND_SLOTS = HOST + "send"
RECV_SLOTS = HOST + "recv"


def is_host(buffer: str) -> bool:
    return buffer.startswith(HOST)


def staged(schedule: Schedule, window: int, unstaged: frozenset[int] = frozenset()) -> Schedule:
    """`schedule` with its messages through host slots, except those to and from the `unstaged` peers
    (which a device transport of their own reaches)."""
    if window < 1:
        raise ValueError(f"window ({window}) must be positive")
    b = ScheduleBuilder.like(schedule)
    for name, size in schedule.scratch:
        b.scratch(name, size)
    messages = [op for op in schedule.ops if op.peer is not None and op.peer not in unstaged]
    size = max((op.regions[0].count for op in messages), default=0)
    channels: dict[tuple[OpKind, int], int] = {}  # channel -> its index among its kind's channels
    for op in messages:
        if (op.kind, op.peer) not in channels:
            channels[op.kind, op.peer] = sum(kind is op.kind for kind, _ in channels)
    for kind, name in ((OpKind.SEND, SEND_SLOTS), (OpKind.RECV, RECV_SLOTS)):
        if any(k is kind for k, _ in channels):
            b.scratch(name, sum(k is kind for k, _ in channels) * window * size)
    taken = dict.fromkeys(channels, 0)  # slots taken so far, per channel

    def slot(op, region: Ref) -> Ref:
        channel = (op.kind, op.peer)
        first = (channels[channel] * window + taken[channel] % window) * size
        taken[channel] += 1
        return Ref(SEND_SLOTS if op.kind is OpKind.SEND else RECV_SLOTS, first, region.count)

    for op in schedule.ops:
        if op.peer in unstaged:
            b.add(op)
        elif op.kind is OpKind.SEND:
            staging = slot(op, op.src)
            b.copy(staging, op.src)
            b.send(op.peer, staging)
        elif op.kind is OpKind.RECV:
            staging = slot(op, op.dst)
            b.recv(op.peer, staging)
            b.copy(op.dst, staging)
        else:
            b.add(op)
    return b.build()
