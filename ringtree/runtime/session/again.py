"""Calls repeated on the same arrays: a call's run kept bound to its small arrays (its session's
`again`, the fastest path of every collective); what calls share without being bound to arrays is in
shapes.py.

Each public function looks its result array up in its communicator's kept runs (kept_runs: by
public function and id) and, if the other arguments are the same objects as before and the arrays
pass the checks that can change in place, runs the entry again; `docs/design.md`, "The call path"."""

from __future__ import annotations

from functools import partial

import numpy as np
from mpi4py import MPI

from ...errors import PeerFailure
from ...ops import ReduceOp
from ...schedule.collectives import COLLECTIVES
from ..engine.in_flight import IN_FLIGHT
from ..engine.native import native_on
from ..engine.stepwise import bound_steps, run_stepwise
from ..safety.stalls import WATCHDOG, watched
from ..safety.threads import THREADS, get_ident
from .one_caller import intruded, one_caller
from .state import SESSIONS, existing_state

__all__ = ["kept_runs", "ran_into_given", "started_again", "INTO_GIVEN", "RECENT", "BY_ID",
           "BY_VALUE", "MISSED", "keep_again", "keep_new_result", "may_keep", "steps_runner", "place", "flat"]

IN_PLACE, WORLD, NDARRAY = MPI.IN_PLACE, MPI.COMM_WORLD, np.ndarray


def steps_runner(call, state, steps: tuple, source, target):
    """A function of none that runs a stepwise plan's compiled `steps` on the call's arrays, bound to
    them (stepwise.bound_steps): what it looks up, looked up once, for a call repeated on those arrays."""
    steps = bound_steps(steps, [source, target, *call.stepwise_scratch], state.remote)
    reduce, copy, divide = call.bound
    average, nranks, signature = call.average, state.size, call.signature

    def run() -> None:
        try:
            run_stepwise(steps, reduce, copy, state, signature)
        except PeerFailure as error:
            state.broken = error  # messages of the other ranks' call may be left unmatched
            raise
        if average:
            divide(target, nranks)
    return run


MISSED = object()  # _Again.ran's answer where the arguments are not the call's


class _Again:
    """A small call of any collective, blocking or started, that ran a stepwise or native plan (or
    started any plan) with no trial, check or timeout, and that run bound to its arrays: a loop
    repeating the call on the same arrays runs it again after only the checks those arrays can fail
    (writability and dtype may change in place). Kept by its result array, which the call returns;
    `first`, `second` and `third` are its other arguments, compared by identity (a class with
    slots: its attributes are read faster than a NamedTuple's). `other`: the entry of another call
    on the same result array (another op, algorithm or input: a loop may take turns among them),
    looked at where this one's arguments are not the call's."""

    __slots__ = ("result", "first", "second", "third", "algorithm", "comm", "state", "dtype", "source_dtype",
                 "native", "run", "what", "confirm", "thread", "handle", "world", "other")

    def __init__(self, result, arguments, algorithm, comm, state, source_dtype, native, run, what, confirm) -> None:
        self.result = result  # the caller's arrays, held so that their ids stay their own; None: a reduce's other ranks'
        self.first, self.second, self.third = arguments
        self.algorithm, self.comm, self.state = algorithm, comm, state
        self.dtype = None if result is None else result.dtype
        self.source_dtype = source_dtype  # the send array's, or None for none (in place, a broadcast)
        # run: the call bound to the arrays (a started call's returns its Request); native: it waits in
        # MPI's own only, or not at all, so that no collective in flight waits for it
        self.native, self.run = native, run
        self.what = what  # what a stall warning says of it (stalls.Call, or a description)
        self.confirm = confirm  # one_caller's confirmation of a blocking call's end (small.confirm_end)
        self.thread = get_ident()  # only the thread that made it runs it: another must be noted (threads.py)
        self.handle = comm.handle  # the thread's mark while in it (threads.THREADS.first_in)
        self.world = comm is WORLD  # a call that leaves its communicator out (None) means this one
        self.other = None

    def ran(self, first, second, third, comm, algorithm, given=None):
        """Where these are the call's arguments (its result array's looked up by id), the call run
        again, as one_caller.in_call runs a call (_call), and what it returns: its result, or a started
        call's Request; else MISSED. (`given`: _NewResult's, which chains may pass on.)"""
        result, state = self.result, self.state
        if not (first is self.first and second is self.second and third is self.third
                and (comm is self.comm or comm is None and self.world) and algorithm is self.algorithm
                and self.thread == get_ident() and state.broken is None
                and (result is None or result.flags.writeable and result.dtype is self.dtype)
                and (self.source_dtype is None or first.dtype is self.source_dtype)
                and (self.native or not IN_FLIGHT.running)):
            other = self.other
            return MISSED if other is None else other.ran(first, second, third, comm, algorithm)
        ran = self._call(self.run)
        return result if ran is None else ran  # a started call's run returns its Request

    def _call(self, run, *arguments):
        """run(*arguments) as one_caller.in_call runs a call, its checks and watched() inlined."""
        comm = self.comm
        if THREADS.several:
            return one_caller(comm, watched, partial(run, *arguments), self.what, confirm=self.confirm)
        outer, THREADS.first_in = THREADS.first_in, self.handle
        waiting = WATCHDOG.first
        waiting[0] = self.what
        try:
            if THREADS.several:  # read again: a second thread has called since
                ran = one_caller(comm, run, *arguments, confirm=self.confirm)
            else:
                ran = run(*arguments)
        finally:
            THREADS.first_in, waiting[0] = outer, None
            waiting[1] += 1
        if THREADS.intruder is not None:
            intruded()
        return ran


class _NewResult(_Again):
    """A blocking call whose shape runs MPI's own or a step at a time, on arrays new at each call: into a
    new result (recvbuf None: a solver's dot product), into a result array given but new too
    (`into_given`: a loop's np.empty, or a fresh input into the same output), or, a broadcast's, on a
    new buffer. Kept by its shape, not its arrays (its session's again[name] at id(None), or
    INTO_GIVEN): a call of the same other arguments, communicator and algorithm on C-contiguous numpy
    arrays of the same dtypes and shapes, apart, runs the shape's plan on them (and a result made as
    the first call's was), and returns the result; a step at a time, only while no other collective
    is in flight, whose messages a step's receive could take."""

    __slots__ = ("shape", "made", "gives_first", "places", "writes_first", "whole", "into_given", "result_dtype",
                 "result_shape", "returned", "recent", "started")

    def __init__(self, arguments, result, places, algorithm, comm, state, native, run, what, confirm,
                 into_given: bool, returned: int, started: bool = False) -> None:
        first = arguments[0]
        super().__init__(None, arguments, algorithm, comm, state, None, native, run, what, confirm)
        self.started = started  # run(source, target, result) starts the call and returns its Request
        self.first = None  # no array held: each call brings its own
        self.dtype, self.shape = first.dtype, first.shape
        self.into_given, self.returned = into_given, returned  # returned: the result's place among the arguments
        self.recent: dict = {}  # into given arrays: the last RECENT calls' (first, result), by their ids
        # None: a new result, or a reduce's other ranks, whose result array is not looked at
        self.result_dtype, self.result_shape = (result.dtype, result.shape) if into_given and result is not None else (
            None, None)
        self.gives_first = result is first  # a broadcast's buffer; else a new result, or None (a reduce's others)
        self.made = None if result is None or self.gives_first or into_given else result.shape
        self.places = places  # (array, start, stop) of the call's source and target: 0 the first, 1 the result
        self.writes_first = places[1][0] == 0 and places[1][2] > places[1][1]
        self.whole = ((self.made is not None or self.result_shape is not None) and len(result.shape) == 1
                      and places == ((0, 0, first.size), (1, 0, result.size)))

    def same_shape(self, other) -> bool:
        """Whether `other` (a _NewResult) runs the calls this one runs."""
        return (other.dtype is self.dtype and other.shape == self.shape and other.second is self.second
                and other.third is self.third and other.comm is self.comm and other.algorithm == self.algorithm
                and other.result_dtype is self.result_dtype and other.result_shape == self.result_shape)

    def ran(self, first, second, third, comm, algorithm, given=None):
        """As _Again.ran, on `first`, new at each call; into `given` where the entry runs calls into a
        result given (ran_into)."""
        if not (type(first) is NDARRAY and first.dtype is self.dtype and first.shape == self.shape
                and first.flags.c_contiguous and (first.flags.writeable or not self.writes_first)
                and second is self.second and third is self.third
                and (comm is self.comm or comm is None and self.world) and algorithm is self.algorithm
                and self.thread == get_ident() and self.state.broken is None
                and (self.native or not IN_FLIGHT.running)):  # another shape's, behind it?
            return MISSED if self.other is None else self.other.ran(first, second, third, comm, algorithm, given)
        if self.into_given:
            result = self._given(first, given)
            if result is MISSED:
                return MISSED
        else:
            made = self.made
            result = np.empty(made, self.dtype) if made is not None else first if self.gives_first else None
        if self.whole and first.ndim == 1:  # the source the whole first array, the target the whole result
            source, target = first, result
        else:
            arrays, places = (first, result), self.places
            source, target = flat(arrays, *places[0]), flat(arrays, *places[1])
        if self.started:
            return self._call(self.run, source, target, result)
        self._call(self.run, source, target)
        return result

    def ran_into(self, buffers, comm, algorithm):
        """Where `buffers` (the public function's, its result among them) are a call of this shape into a
        result array given, the call run into it, which it returns; else MISSED."""
        returned = self.returned  # _compared(), inlined: a frame costs an 8 B call
        first, second, third = (*buffers[:returned], *buffers[returned + 1:], None, None)[:3]
        return self.ran(first, second, third, comm, algorithm, buffers[returned])

    def _given(self, first, given):
        """What a call into `given` runs into: `given`, or None at a reduce's other ranks (theirs is not
        looked at); MISSED where `given` is not like the first call's, or these arrays come again (the
        way that binds a run to them then, shapes.seen_before)."""
        if given is None or self.result_shape is not None and not (  # None: a new result's run, by None
                type(given) is NDARRAY and given.dtype is self.result_dtype and given.shape == self.result_shape
                and given.flags.carray and not np.may_share_memory(first, given)):  # carray: C-contiguous, writeable
            return MISSED
        pair, recent = (id(first), id(given)), self.recent
        if pair in recent:
            return MISSED
        if len(recent) >= RECENT:
            del recent[next(iter(recent))]
        recent[pair] = first, given  # held, so that their ids stay theirs
        return None if self.result_shape is None else given


# A session's runs kept by public function (allreduce, iallreduce, broadcast, ...) and the id of their
# result array (two collectives' calls on one array may take turns in a loop). Holding the arrays keeps
# them alive, so only small ones (AGAIN_ENTRIES of at most NATIVE_AGAIN_MAX bytes), and a few.
_NONE_KEPT: dict[str, dict] = {name: {} for collective in COLLECTIVES for name in (collective, "i" + collective)}


def ran_into_given(name, comm, algorithm, buffers):
    """A blocking call of collective `name` (`buffers`, the public function's arguments) on new arrays,
    into a result array given among them, run by its shape's kept run (_NewResult.ran_into), and its
    result; MISSED where none is kept or the call is not of its shape."""
    last = SESSIONS.kept
    into = (last[1] if comm is last[0] else kept_runs(comm))[name].get(INTO_GIVEN)
    return MISSED if into is None else into.ran_into(buffers, comm, algorithm)


def started_again(name, comm, algorithm, buffers):
    """A nonblocking call of collective `name` on `buffers` (its public function's arguments) started by
    the start kept for its result array (its i-function's entry: a persistent request's Start looks
    there as the i-function does), and its Request; MISSED where none is kept or the call is not its."""
    returned, last = COLLECTIVES[name].returned_argument, SESSIONS.kept
    kept = (last[1] if comm is last[0] else kept_runs(comm))["i" + name].get(id(buffers[returned]))
    return MISSED if kept is None else kept.ran(*_compared(buffers, returned), comm, algorithm)


def _compared(buffers, returned: int) -> tuple:
    """The three arguments a kept run compares (first, second, third): a public function's `buffers` but
    the one it returns (at `returned`), None for those it lacks."""
    return (*buffers[:returned], *buffers[returned + 1:], None, None)[:3]


def kept_runs(comm) -> dict[str, dict]:
    """The runs kept on `comm` (None: MPI.COMM_WORLD) by public function and result array; none where
    ringtree has not set it up (never written: a run is kept on its session, keep_again)."""
    state = existing_state(WORLD if comm is None else comm)
    if state is None:
        return _NONE_KEPT
    SESSIONS.kept = (comm, state.again)  # for the next call's look-up (the public functions look there first)
    return state.again


INTO_GIVEN = -1  # the key of a shape's run into result arrays given (_NewResult.ran_into): no array's id
AGAIN_MAX = 65536  # bytes: above, a call's checks cost under 5 % of it
# bytes, where the run is MPI's own blocking collective, which takes so much less time than a
# schedule's run that up to here the checks still weigh over 5 % of it (docs/performance.md)
NATIVE_AGAIN_MAX = 1 << 20
AGAIN_ENTRIES = 16
# Calls kept on one result array: a loop that takes turns among as many (every algorithm's and
# auto's, in a benchmark; two ops) finds each.
AGAIN_CHAIN = 8
RECENT = 4  # argument sets: a loop that takes turns among as many binds each to its arrays (shapes.seen_before)

# The arguments a repeat holds by identity (held by it, so that their ids stay theirs), and those
# it holds by value.
BY_ID = frozenset((np.ndarray, MPI.Op, ReduceOp, type(MPI.IN_PLACE)))
BY_VALUE = frozenset((int, str, type(None)))


def keep_again(name, blocking: bool, buffers, result, nbytes: int, algorithm, comm, state, run, after, what, confirm,
               native: bool = True) -> None:
    """Keep the `run` of a call of collective `name` on `buffers` (a started call's: its start), bound to
    the caller's arrays, for its repeats on them (_Again): where they are numpy arrays of up to
    AGAIN_MAX bytes in all (NATIVE_AGAIN_MAX where a blocking run waits in MPI's own), `result` (what
    it returns) one of them (None at a reduce's other ranks than the root, which do not look at their
    recvbuf), and its other arguments values or arrays. `native`: a blocking run waits in MPI's own
    only; `confirm`: one_caller's for a blocking call."""
    largest = NATIVE_AGAIN_MAX if blocking and native else AGAIN_MAX
    if nbytes > largest or not may_keep(state, blocking):
        return
    returned = COLLECTIVES[name].returned_argument
    own = buffers[returned]
    if result is not None and (result is not own or type(result) is not NDARRAY):  # None: a reduce's others'
        return
    if not all(type(value) in BY_ID or type(value) in BY_VALUE for at, value in enumerate(buffers) if at != returned):
        return
    if after is not None:
        run = partial(_then, run, after)
    kept, arguments = state.again[name if blocking else "i" + name], _compared(buffers, returned)
    if len(kept) >= AGAIN_ENTRIES:
        kept.clear()
    first = arguments[0]
    entry = _Again(result, arguments, algorithm, comm, state,
                   first.dtype if type(first) is NDARRAY else None, native or not blocking, run, what, confirm)
    # those of the same arguments replaced, and those of another result (a reduce's at a root and not:
    # a public function returns the first's)
    _chain(entry, kept.get(id(own)), lambda previous: previous.result is not entry.result or (
        previous.first is entry.first and previous.second is entry.second and previous.third is entry.third
        and previous.comm is entry.comm and previous.algorithm == entry.algorithm))
    kept[id(own)] = entry


def _chain(entry: _Again, previous: _Again | None, replaced) -> None:
    """Put the entries kept before `entry` under its key (`previous` and its others) behind it, the newest
    first, AGAIN_CHAIN in all at most, but those that `replaced(previous)` says it replaces."""
    last = entry
    for _ in range(AGAIN_CHAIN - 1):
        while previous is not None and replaced(previous):
            previous = previous.other
        if previous is None:
            break
        last.other = last = previous
        previous = previous.other
    last.other = None


def keep_new_result(name, buffers, call, algorithm, comm, state, plan, what, confirm, start=None) -> None:
    """Keep a blocking call of collective `name` on `buffers` whose shape runs MPI's own (its `plan`'s
    native) or a step at a time, or a started call given its `start` (a function of source, target and
    result that starts it and returns its Request), for the calls of its shape after it on new arrays
    (_NewResult): where its result is a new array (recvbuf None), a broadcast's buffer, or (a blocking
    call's) a numpy array given apart from the first, and the call (`call`, a collective_args.Call)
    holds views of its arrays and nothing else; `confirm` as for keep_again."""
    returned, blocking, key = COLLECTIVES[name].returned_argument, start is None, new_result_key(name, buffers)
    first, given, into_given = buffers[0], buffers[returned], key == INTO_GIVEN
    if (type(first) is not NDARRAY or call.after is not None or call.context is not None
            or not may_keep(state, blocking) or (into_given and not blocking)  # an i-function looks by None only
            or first.nbytes > (NATIVE_AGAIN_MAX if blocking and plan.native is not None else AGAIN_MAX)
            or (into_given and call.result is not None and (type(given) is not NDARRAY or call.result is not given))
            or not all(type(value) in BY_VALUE or type(value) in BY_ID for value in buffers)):
        return
    places = (place(call.source, (first, call.result)), place(call.target, (first, call.result)))
    run = (start if not blocking else native_on(plan.native, state, call, what) if plan.native is not None
           else _steps_on(plan, state, call))
    if None in places or run is None:
        return
    arguments = (*buffers, None, None)[:3] if given is first else _compared(buffers, returned)  # a broadcast's: all
    entry = _NewResult(arguments, call.result, places, algorithm, comm, state, plan.native is not None or not blocking,
                       run, what, confirm, into_given, returned, not blocking)
    kept = state.again[name if blocking else "i" + name]
    # other shapes' behind it (a loop may take turns); it replaces its own shape's, and a reduce's
    # others' run kept by their result array, None (keep_again)
    _chain(entry, kept.get(key), lambda previous: type(previous) is not _NewResult or previous.same_shape(entry))
    kept[key] = entry


def new_result_key(name, buffers) -> int:
    """The key a call of collective `name` on `buffers` (its public function's arguments) has among the
    runs kept by their shape (_NewResult): INTO_GIVEN into a result array given apart from the first,
    else that of None."""
    given = buffers[COLLECTIVES[name].returned_argument]
    return INTO_GIVEN if given is not None and given is not buffers[0] else id(None)


def _steps_on(plan, state, call):
    """The plan's steps (a stepwise plan's, with no timeout) as a function of (source, target), bound
    to them at each call; None where the plan has none to run."""
    steps = plan.stepwise_steps(call.inplace)
    if steps is None:
        return None
    return lambda source, target: steps_runner(plan, state, steps, source, target)()


def may_keep(state, blocking: bool = True) -> bool:
    """Whether a run may be kept bound on `state`'s communicator: not with several threads and no
    signatures (its waits would be inside MPI), nor, where signatures are on, a blocking call's before
    the communicator's first call is confirmed (one_caller.py), which an entry's run skips: a first call
    that raised leaves that to the next, on every rank. A started call confirms nothing either way."""
    if not state.signatures:
        return not THREADS.several
    return not (blocking and state.unconfirmed)


def place(array, arrays) -> tuple | None:
    """(i, start, stop): `array` (1-D) is elements start:stop of arrays[i] flattened; or None."""
    at = array.__array_interface__["data"][0]
    for index, whole in enumerate(arrays):
        if whole is not None and whole.dtype == array.dtype:
            first = whole.__array_interface__["data"][0]
            if first <= at and at + array.nbytes <= first + whole.nbytes and (at - first) % array.itemsize == 0:
                start = (at - first) // array.itemsize
                return index, start, start + array.size
    return None


def flat(arrays, index: int, start: int, stop: int):
    """Elements start:stop of arrays[index] flattened (a place's)."""
    array = arrays[index]
    whole = array if array.ndim == 1 else array.reshape(-1)
    return whole if start == 0 and stop == whole.size else whole[start:stop]


def _then(run, after) -> None:
    run()
    after()
