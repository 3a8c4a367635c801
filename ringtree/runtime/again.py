"""Calls repeated on the same arrays: a call's run kept bound to its small arrays (AGAIN, the fastest
path of every collective); what calls share without being bound to arrays is in shapes.py.

Each public function looks its result array up in its own AGAIN entries (by id)
and, if the other arguments are the same objects as before and the arrays pass
the checks that can change in place, runs the entry again; `docs/design.md`,
"The call path".
"""

from __future__ import annotations

from functools import partial

import numpy as np
from mpi4py import MPI

from ..errors import PeerFailure
from ..ops import ReduceOp
from ..schedule.ir import COLLECTIVES
from .in_flight import IN_FLIGHT
from .native import run_native
from .one_caller import intruded, one_caller
from .stalls import WAITING, watched
from .stepwise import bound_steps, run_stepwise
from .threads import FIRST_IN, THREADED, get_ident

__all__ = ["AGAIN", "BY_ID", "BY_VALUE", "MISSED", "keep_again", "keep_new_result", "may_keep", "steps_runner"]

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
        self.handle = comm.handle  # the thread's mark while in it (threads.FIRST_IN)
        self.world = comm is WORLD  # a call that leaves its communicator out (None) means this one
        self.other = None

    def ran(self, first, second, third, comm, algorithm):
        """Where these are the call's arguments (its result array's looked up by id), the call run
        again, and what its run returns (a started call's Request); else MISSED. It runs as
        one_caller.in_call runs a call, its checks and watched() inlined."""
        result, state = self.result, self.state
        if not (first is self.first and second is self.second and third is self.third
                and (comm is self.comm or comm is None and self.world) and algorithm is self.algorithm
                and self.thread == get_ident() and state.broken is None
                and (result is None or result.flags.writeable and result.dtype is self.dtype)
                and (self.source_dtype is None or first.dtype is self.source_dtype)
                and (self.native or not IN_FLIGHT.running)):
            other = self.other
            return MISSED if other is None else other.ran(first, second, third, comm, algorithm)
        return self._call(self.run)

    def _call(self, run, *arguments):
        """run(*arguments) as one_caller.in_call runs a call, its checks and watched() inlined."""
        comm = self.comm
        if THREADED[1]:
            return one_caller(comm, watched, partial(run, *arguments), self.what, confirm=self.confirm)
        outer, FIRST_IN[0] = FIRST_IN[0], self.handle
        WAITING[0] = self.what
        try:
            if THREADED[1]:  # THREADED read again: a second thread has called since
                ran = one_caller(comm, run, *arguments, confirm=self.confirm)
            else:
                ran = run(*arguments)
        finally:
            FIRST_IN[0], WAITING[0] = outer, None
            WAITING[1] += 1
        if FIRST_IN[1] is not None:
            intruded()
        return ran


class _NewResult(_Again):
    """A blocking allreduce into a new result array each call (recvbuf None: a solver's dot product)
    whose shape runs MPI's own: kept by its shape, not its arrays (AGAIN["allreduce"][id(None)]). A
    call of the same op, algorithm and communicator on any C-contiguous array of the same dtype and
    size runs the shape's plan on that array and a new one, which it returns."""

    __slots__ = ("size", "own")

    def __init__(self, source, op, algorithm, comm, state, own, what, confirm) -> None:
        super().__init__(source, (source, op, None), algorithm, comm, state, None, True, run_native, what, confirm)
        self.result = self.first = None  # no array held: each call brings its own
        self.size, self.own = source.size, own

    def ran(self, first, second, third, comm, algorithm):
        state = self.state
        if not (type(first) is NDARRAY and first.dtype is self.dtype and first.size == self.size
                and first.flags.c_contiguous and second is self.second
                and (comm is self.comm or comm is None and self.world) and algorithm is self.algorithm
                and self.thread == get_ident() and state.broken is None):
            return MISSED
        result = np.empty_like(first)
        flat = first.ndim == 1  # a 1-D array is its own flat view: no reshape to pay for
        self._call(self.run, self.own, state, first if flat else first.reshape(-1), result if flat else result.reshape(-1),
                   False)
        return result


# Each public function's (allreduce, iallreduce, broadcast, ...) by the id of its result array (two
# collectives' calls on one array may take turns in a loop). Holding the arrays keeps them alive,
# so only small ones (AGAIN_ENTRIES of at most NATIVE_AGAIN_MAX bytes), and a few.
AGAIN: dict[str, dict[int, _Again]] = {name: {} for collective in COLLECTIVES for name in (collective,
                                                                                          "i" + collective)}
AGAIN_MAX = 65536  # bytes: above, a call's checks cost under 5 % of it
# bytes, where the run is MPI's own blocking collective, which takes so much less time than a
# schedule's run that up to here the checks still weigh over 5 % of it (docs/performance.md)
NATIVE_AGAIN_MAX = 1 << 20
AGAIN_ENTRIES = 16
# Calls kept on one result array: a loop that takes turns among as many (every algorithm's and
# auto's, in a benchmark; two ops) finds each.
AGAIN_CHAIN = 8

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
    own, *others = (buffers[0], buffers[1]) if name == "broadcast" else (buffers[1], buffers[0], *buffers[2:])
    if (result is not None or name != "reduce") and (result is not own or type(result) is not NDARRAY):
        return
    if not all(type(value) in BY_ID or type(value) in BY_VALUE for value in others):
        return
    if after is not None:
        run = partial(_then, run, after)
    kept, first = AGAIN[name if blocking else "i" + name], others[0]
    if len(kept) >= AGAIN_ENTRIES:
        kept.clear()
    entry = _Again(result, (*others, None, None)[:3], algorithm, comm, state,
                   first.dtype if type(first) is NDARRAY else None, native or not blocking, run, what, confirm)
    _chain(entry, kept.get(id(own)))
    kept[id(own)] = entry


def _chain(entry: _Again, previous: _Again | None) -> None:
    """Put the entries of other calls on `entry`'s result array (`previous` and its others) behind it,
    the newest first, AGAIN_CHAIN in all at most: those of the same arguments as `entry` replaced, and
    those of another result (a reduce's at a root and not: a public function returns the first's)."""
    last = entry
    for _ in range(AGAIN_CHAIN - 1):
        while previous is not None and (previous.result is not entry.result or (
                previous.first is entry.first and previous.second is entry.second and previous.third is entry.third
                and previous.comm is entry.comm and previous.algorithm == entry.algorithm)):
            previous = previous.other
        if previous is None:
            break
        last.other = last = previous
        previous = previous.other
    last.other = None


def keep_new_result(source, op, algorithm, comm, state, own, what, confirm) -> None:
    """Keep a blocking allreduce into a new array on `source`, whose shape runs MPI's own plan `own`,
    for the calls of its shape after it (_NewResult); `confirm` as for keep_again."""
    if may_keep(state):
        AGAIN["allreduce"][id(None)] = _NewResult(source, op, algorithm, comm, state, own, what, confirm)


def may_keep(state, blocking: bool = True) -> bool:
    """Whether a run may be kept bound on `state`'s communicator: not with several threads and no
    signatures (its waits would be inside MPI), nor, where signatures are on, a blocking call's before
    the communicator's first call is confirmed (one_caller.py), which an entry's run skips: a first call
    that raised leaves that to the next, on every rank. A started call confirms nothing either way."""
    if not state.signatures:
        return not THREADED[1]
    return not (blocking and state.unconfirmed)


def _then(run, after) -> None:
    run()
    after()
