"""What calls share without being bound to their arrays, kept in their session: a call with its repeats
on the same arguments (`repeats`, by their ids), and with the calls of its shape (`shapes`): by the
checked shape, found after a call's checks, and by the arrangement of its arguments, found with only
the checks that other arrays of the arrangement can fail (of_arrangement). Runs bound to the arrays
are again.py's; `docs/design.md`, "The call path".
"""

from __future__ import annotations

import numpy as np

from ... import settings
from .again import BY_ID, BY_VALUE, RECENT, flat, may_keep, place

__all__ = ["REPEATS_MAX", "arguments_keys", "shape_key", "of_arrangement", "keep_shape", "seen_before"]

NDARRAY = np.ndarray

# A session's `repeats`: calls by their arguments' ids and values (arguments_keys' key), what a call
# shares with the calls after it on the same arguments. Its `shapes`: by a call's shape (shape_key),
# [what its calls share but their arrays, the arguments of its last calls that ran unbound
# (seen_before)]; by its arguments' arrangement (arguments_keys' arranged), (its shape's entry, the
# arrangement: arrangement_of).
REPEATS_MAX = 64  # entries, of each


def arguments_keys(name, blocking, comm, algorithm, segment, check, timeout, buffers) -> tuple:
    """(key, arranged) of a call, where its arrays are numpy's own and its other arguments plain values;
    (None, None) for any other (tensors, buffer specifications). `key`: its key in its session's repeats,
    by its arrays' ids. A blocking call and a started one differ: the first may run through its plan's
    persistent request (native_runner). `arranged`: its key in `shapes` by its arguments' arrangement,
    arrays by dtype, shape and which of them are one array, with the settings (by identity: the entry
    holds them), for the calls on other arrays of it (of_arrangement); None before the first call has
    read the settings. One pass makes both: a call on new arrays looks up the one after the other."""
    head = (name, blocking, id(comm), algorithm, segment, check, timeout)
    ids, arranged, arrays = [], [], []
    for value in buffers:
        kind = type(value)
        if kind is NDARRAY:
            index = len(arrays)
            for at, array in enumerate(arrays):  # a loop: a generator's set-up costs more than the few arrays
                if array is value:
                    index = at
                    break
            else:
                arrays.append(value)
            ids.append(id(value))
            arranged.append((value.dtype, value.shape, index))
            continue
        if kind in BY_ID:
            value = id(value)
        elif kind is list or kind is tuple:
            if not all(type(item) is int for item in value):
                return None, None
            value = tuple(value)
        elif kind not in BY_VALUE:
            return None, None
        ids.append(value)
        arranged.append(value)
    current = settings.cached()
    return head + tuple(ids), None if current is None else (*head, "arranged", id(current), *arranged)


def shape_key(name, blocking, comm, algorithm, segment, check, timeout, current, collective, count, dtype,
              reduce_op, inplace) -> tuple:
    """A call's key in its session's shapes: its collective's name, blocking or started, communicator,
    options as given and settings (by identity: the entry holds them), and its checked collective, count, dtype, op and
    whether it is in place."""
    return (name, blocking, id(comm), algorithm, segment, check, timeout, id(current), collective, count, dtype,
            reduce_op, inplace)


def of_arrangement(state, arranged, buffers, key) -> tuple | None:
    """(what the calls of its shape share, the call's source, target and result) of a call on numpy arrays
    of an arrangement seen before on `state`'s communicator (its shapes by `arranged`; `key`, its key
    by its arrays' ids: arguments_keys), after only the checks that other arrays of the arrangement can
    fail (rebound); None for the call to go the way of its full checks, as also where its arguments are
    among those the shape's last calls ran unbound with (seen_before), which that way binds to its arrays."""
    found = state.shapes.get(arranged)
    if found is None:
        return None
    entry, arrangement = found
    if key in entry[1] or entry[0].state.broken is not None:
        return None
    arrays = rebound(arrangement, buffers)
    if arrays is None:
        return None
    seen_before(entry, key, buffers)
    return (entry[0], *arrays)


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


def rebound(arrangement, buffers) -> tuple | None:
    """(source, target, result) of a call on these buffers, so arranged (`arrangement`, arrangement_of's),
    after only the checks other arrays of an arrangement can fail: C-contiguous, writeable where
    written, distinct arrays apart; None where one fails (the call's full checks then say what)."""
    source, target, made, written = arrangement
    first = other = None
    for value in buffers:  # two arrays at most
        if type(value) is NDARRAY:
            if first is None:
                first, first_flags = value, value.flags
                if not first_flags.c_contiguous:
                    return None
            elif value is not first:
                other, other_flags = value, value.flags
                if not other_flags.c_contiguous:
                    return None
    if other is not None and not (first_flags.owndata and other_flags.owndata) and np.may_share_memory(first, other):
        return None
    for index in written:
        if not buffers[index].flags.writeable:
            return None
    if made is None or type(made) is int:
        result = made if made is None else buffers[made]
    else:
        result = np.empty(*made)
        buffers = (*buffers, result)
    return flat(buffers, *source), flat(buffers, *target), result
