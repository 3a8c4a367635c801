"""One thread at a time in a call on a communicator: a second thread in a call on the same
communicator at once raises MismatchError on every rank, as MPI needs one order of the collectives on
a communicator (docs/design.md, "Threads").

A rank that sees the second thread raises at once, but another rank may have finished the call by
then, with a result of another thread's call there. So a blocking call that may be paired so ends
only once every rank has confirmed its end (`confirm`, a one-byte allreduce, which a rank that raised
instead ends with its notice): a communicator's first call, and the SWITCH_WINDOW calls on it from
the call of a thread other than the one that made the call before (its state's threads_bit, in their
signatures, so that ranks which differ in it raise too)."""

from __future__ import annotations

from mpi4py import MPI

from ...errors import MismatchError
from ..safety.mismatch import UNKNOWN, everywhere
from ..safety.threads import THREADS, enter_call, first_thread, get_ident, leave_call, note_thread, thread_token
from .state import SESSIONS, existing_state

__all__ = ["THREADS_BIT", "in_call", "intruded", "one_caller", "second_thread"]

THREADS_BIT = 1 << 3  # of a signature's code: within the 7 bits that the smallest TAG_UB leaves
SWITCH_WINDOW = 64  # calls confirmed from each call on a communicator by another thread than the call before


def in_call(comm, run, *arguments, confirm=None):
    """run(*arguments) as a call on `comm` under the thread rules: once several threads call ringtree,
    as one_caller runs it. Before, in the first thread to call: marked as in a call on `comm`
    (THREADS.first_in), so that a second thread's first call on it raises on every rank, and so does this
    call at its end; `confirm(comm)` ends the communicator's first call."""
    first = THREADS.first
    if THREADS.several or (first if first is not None else first_thread(get_ident())) != get_ident():
        return one_caller(comm, run, *arguments, confirm=confirm)
    communicator = MPI.COMM_WORLD if comm is None else comm
    outer = THREADS.first_in  # a call of ringtree's own within the call (check mode's agreement) gives it back
    # set before `several` is read: a second thread sets that, then reads this
    THREADS.first_in = getattr(communicator, "handle", None)
    try:
        if THREADS.several:
            result = one_caller(comm, run, *arguments, confirm=confirm)
        else:
            result = run(*arguments)
            if outer is None and confirm is not None and THREADS.intruder is None:
                _confirm_if_due(comm, communicator, None, confirm)
    finally:
        THREADS.first_in = outer
    if THREADS.intruder is not None:
        intruded()
    return result


def intruded() -> None:
    """At the end of the first thread's call (in_call, or allreduce's repeat): raise on every
    rank if a second thread called on its communicator meanwhile."""
    if THREADS.intruder is not None:
        comm, THREADS.intruder = THREADS.intruder, None
        second_thread(comm, None)


def one_caller(comm, run, *arguments, confirm=None):
    """run(*arguments), once several threads call ringtree, as the one thread in a call on `comm`
    (threads.enter_call): MismatchError on every rank if another thread is in a call on it too.
    `confirm(comm)` ends the call where another thread called on `comm` within SWITCH_WINDOW calls,
    and the communicator's first call."""
    communicator = MPI.COMM_WORLD if comm is None else comm
    me = get_ident()
    if not THREADS.several:
        note_thread(communicator)  # `several` set before `first_in` is read: in_call reads them the other way
    first = THREADS.first_in  # the first thread's call that began before any other thread called
    if first is not None and me != THREADS.first and first == getattr(communicator, "handle", None):
        THREADS.intruder = communicator
        second_thread(comm, THREADS.first)
    inside = enter_call(comm, second_thread)
    outermost = inside is not None and inside[1] == 1  # not a call of ringtree's own within one
    try:
        state = _state(communicator)
        if state is not None and outermost:
            token = thread_token()
            if state.caller is not token:
                state.caller, state.to_confirm = token, SWITCH_WINDOW
            state.threads_bit = THREADS_BIT if state.to_confirm else 0
            state.to_confirm -= state.to_confirm > 0
        result = run(*arguments)
        if confirm is not None and outermost and inside[2] is None:
            _confirm_if_due(comm, communicator, state, confirm)
    finally:
        other = leave_call(inside)
    if other is not None:
        second_thread(comm, other)
    return result


def _confirm_if_due(comm, communicator, state, confirm) -> None:
    """End a call with every rank's confirmation where one is due: the communicator's first call, and
    those whose threads_bit is set (the module's docstring)."""
    state = state or _state(communicator)
    if state is not None and (state.threads_bit or state.unconfirmed) and state.signatures:
        state.unconfirmed = False
        confirm(comm)


def _state(communicator):
    last = SESSIONS.last  # read once: another thread may change it
    return last[1] if last[0] is communicator else existing_state(communicator)


def second_thread(comm, other: int | None):
    """Raise MismatchError on every rank: a second thread calls on `comm` while thread `other` is in a
    call on it (it raises too, once the other ranks have). While the other thread is still setting the
    communicator up (its first ringtree call), on this rank only: that thread raises on every rank at
    the end of its call."""
    communicator = MPI.COMM_WORLD if comm is None else comm
    reason = ("two threads were in calls on it at once; MPI needs one order of collectives on a communicator, which "
              "two threads do not give: let each thread use a communicator of its own (comm.Dup())")
    state = existing_state(communicator)
    if state is None:
        raise MismatchError(f"ringtree on rank {communicator.Get_rank()}: {reason}")
    raise everywhere(state, state.calls, UNKNOWN, reason, reason)
