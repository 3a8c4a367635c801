"""What calls share without being bound to their arrays, kept in their session: a call with its repeats
on the same arguments (`repeats`, by their ids), and with the calls of its shape (`shapes`): by the checked shape, found after
a call's checks, and by the arrangement of its arguments, found with only the checks that other
arrays of the arrangement can fail (of_arrangement; repeat_of, an allreduce's own look-up by its
checked shape). Runs bound to the arrays are again.py's; `docs/design.md`, "The call path".
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import settings
from ...ops import known_op
from ...schedule.ir import ALLREDUCE
from ..engine.in_flight import IN_FLIGHT
from .again import BY_ID, BY_VALUE, RECENT, flat, may_keep, place

__all__ = ["REPEATS_MAX", "arguments_key", "shape_key", "of_arrangement", "keep_shape", "seen_before", "repeat_of"]

IN_PLACE, WORLD, NDARRAY = MPI.IN_PLACE, MPI.COMM_WORLD, np.ndarray

# A session's `repeats`: calls by their arguments' ids and values (arguments_key), what a call shares
# with the calls after it on the same arguments. Its `shapes`: by a call's shape (shape_key), [what its
# calls share but their arrays, the arguments of its last calls that ran unbound (seen_before)]; by its
# arguments' arrangement (arguments_key, arranged), (its shape's entry, the arrangement: arrangement_of).
REPEATS_MAX = 64  # entries, of each


def arguments_key(name, blocking, comm, algorithm, segment, check, timeout, buffers, arranged=False) -> tuple | None:
    """A call's key in its session's repeats, where its arrays are numpy's own and its other arguments plain values;
    None for any other (tensors, buffer specifications). A blocking call and a started one differ: the
    first may run through its plan's persistent request (native_runner). `arranged`: its key in `shapes`
    by its arguments' arrangement instead, arrays by dtype, shape and which of them are one array, with
    the settings (by identity: the entry holds them), for the calls on other arrays of it (of_arrangement);
    None before the first call has read the settings."""
    parts = [name, blocking, id(comm), algorithm, segment, check, timeout]
    if arranged:
        current = settings.cached()
        if current is None:
            return None
        parts += ("arranged", id(current))
        arrays = []
    for value in buffers:
        kind = type(value)
        if arranged and kind is NDARRAY:
            parts.append((value.dtype, value.shape, next((index for index, array in enumerate(arrays) if array is value),
                                                         len(arrays))))
            arrays.append(value)
        elif kind in BY_ID:
            parts.append(id(value))
        elif kind in BY_VALUE:
            parts.append(value)
        elif (kind is list or kind is tuple) and all(type(item) is int for item in value):
            parts.append(tuple(value))
        else:
            return None
    return tuple(parts)


def shape_key(name, blocking, comm, algorithm, segment, check, timeout, current, collective, count, dtype,
              reduce_op, inplace) -> tuple:
    """A call's key in its session's shapes: its collective's name, blocking or started, communicator,
    options as given and settings (by identity: the entry holds them), and its checked collective, count, dtype, op and
    whether it is in place."""
    return (name, blocking, id(comm), algorithm, segment, check, timeout, id(current), collective, count, dtype,
            reduce_op, inplace)


def of_arrangement(state, arranged, buffers, key) -> tuple | None:
    """(what the calls of its shape share, the call checked) of a call on numpy arrays of an arrangement
    seen before on `state`'s communicator (its shapes by `arranged`, its arguments_key arranged; `key`,
    its arguments_key), after
    only the checks that other arrays of the arrangement can fail (rebound); None for the call to go
    the way of its full checks, as also where its arguments are among those the shape's last calls
    ran unbound with (seen_before), which that way binds to its arrays."""
    found = state.shapes.get(arranged)
    if found is None:
        return None
    entry, arrangement = found
    if key in entry[1] or entry[0].state.broken is not None:
        return None
    call = rebound(entry[0], arrangement, buffers)
    if call is None:
        return None
    seen_before(entry, key, buffers)
    return entry[0], call


def seen_before(entry, key, buffers) -> bool:
    """Whether a call's arguments (`key`; `buffers`, held so that the ids in it stay theirs) are among the
    last RECENT that its shape's calls ran unbound (the shapes `entry`); remembered if not. A call is
    bound to its arrays once they come again: new arrays each call would pay for bindings unused."""
    recent = entry[1]
    if key in recent:
        return True
    if len(recent) >= RECENT:
        del recent[next(iter(recent))]
    recent[key] = buffers
    return False


def keep_shape(entry, key_of_shape, shape, call, blocking, buffers, key, arranged) -> None:
    """Keep what the calls of a shape share (`shape`, with no arrays) by the shape's key, unless its
    `entry` is kept already, and, where the call's arguments have a key (`key`) and their arrangement a
    way to other arrays (arrangement_of), the arrangement by its key (`arranged`), with the entry."""
    shapes = shape.state.shapes
    if len(shapes) >= REPEATS_MAX:
        shapes.clear()
    if entry is None:
        shapes[key_of_shape] = entry = [shape, {}]
        if key is not None and not may_keep(shape.state, blocking):
            seen_before(entry, key, buffers)  # its arrays are not bound now: bound once they come again
    if key is not None:
        arrangement = arrangement_of(call, buffers) if arranged not in shapes else None
        if arrangement is not None:
            shapes[arranged] = entry, arrangement


def arrangement_of(call, buffers) -> tuple | None:
    """How a checked call's arrays come from its `buffers`, for calls on other arrays so arranged
    (rebound): (where its source and target lie in the buffers or a new result, its result, the
    buffers that must be writeable); None where the call
    holds more than views of them (a scratch target, an `after`, a context), a new result that is not a
    numpy array, or two of its arrays share memory."""
    if call.after is not None or call.context is not None:
        return None
    result, arrays = call.result, [value if type(value) is NDARRAY else None for value in buffers]
    first, *others = [array for array in arrays if array is not None] or [None]
    if any(other is not first and np.may_share_memory(first, other) for other in others):
        return None  # two views of one memory (in place by aliasing): a place would not say which
    made = None if result is None else next((index for index, value in enumerate(buffers) if value is result), None)
    if made is None and result is not None:
        if type(result) is not NDARRAY:
            return None
        made = (result.shape, result.dtype)
        arrays.append(result)  # where a place's index is len(buffers)
    places = [place(array, arrays) for array in (call.source, call.target)]
    if None in places:
        return None
    written = tuple(index for index in {places[1][0], made if type(made) is int else -1}
                    if 0 <= index < len(buffers) and buffers[index].flags.writeable)  # as the first call's were
    return places[0], places[1], made, written


def rebound(shape, arrangement, buffers):
    """The call of `shape` (its checked call with no arrays) on these buffers, so arranged (`arrangement`,
    arrangement_of's), after only the checks other arrays of an arrangement can fail: C-contiguous,
    writeable where written, distinct arrays apart; None where one fails (the call's full checks then
    say what)."""
    source, target, made, written = arrangement
    first = other = None
    for value in buffers:  # two arrays at most
        if type(value) is NDARRAY:
            if not value.flags.c_contiguous:
                return None
            if first is None:
                first = value
            elif value is not first:
                other = value
    if other is not None and not (first.flags.owndata and other.flags.owndata) and np.may_share_memory(first, other):
        return None
    for index in written:
        if not buffers[index].flags.writeable:
            return None
    if made is None or type(made) is int:
        result = made if made is None else buffers[made]
    else:
        result = np.empty(*made)
        buffers = (*buffers, result)
    # a collective_args.Call of its checked arguments alone: no after, no context (arrangement_of)
    return type(shape)(shape.collective, shape.count, flat(buffers, *source), flat(buffers, *target), shape.inplace,
                       shape.backend, shape.reduce_op, result, None, None)


def repeat_of(state, sendbuf, recvbuf, op, comm, algorithm, segment, check, timeout, blocking=True):
    """The shortcut of a stepwise or native allreduce of a shape seen before (`state`'s shapes, as
    call_path._first keys it) on the same communicator: same op, algorithm, dtype, size and in-place-ness, numpy arrays,
    default segment, check and timeout. Only what may differ between such calls is checked: the arrays'
    layout, writability and overlap. Returns (plan, state, steps, source, target, in place, its shapes
    entry), or None for allreduce to check the call in full. A `blocking` call takes it only with
    nothing in flight (the stepwise path)."""
    if (type(recvbuf) is not NDARRAY or segment is not None or check is not None or timeout is not None
            or type(algorithm) is not str or (blocking and IN_FLIGHT.running)):
        return None
    inplace = sendbuf is IN_PLACE or sendbuf is recvbuf
    seen = state.shapes.get(shape_key("allreduce", blocking, WORLD if comm is None else comm, algorithm, None, None, None,
                                settings.cached(), ALLREDUCE, recvbuf.size, recvbuf.dtype, known_op(op), inplace))
    if seen is None:
        return None
    plan, state, flags = seen[0].plan, seen[0].state, recvbuf.flags
    steps = plan.in_place_steps if inplace else plan.steps
    if (not flags.carray or state.broken is not None  # carray: C-contiguous, writeable
            or seen[0].comparison is not None or seen[0].timeout is not None
            or (blocking and plan.native is None and (plan.bound is None or steps is None))):
        return None
    target = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
    if inplace:
        return plan, state, steps, target, target, True, seen
    if type(sendbuf) is not NDARRAY or sendbuf.dtype is not recvbuf.dtype or not flags.owndata:
        return None
    flags = sendbuf.flags
    if not (flags.c_contiguous and flags.owndata) or sendbuf.shape != recvbuf.shape:
        return None  # views may overlap, which allreduce checks
    return plan, state, steps, sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1), target, False, seen
