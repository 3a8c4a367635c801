"""One thread at a time in a call on a communicator, once several threads call ringtree: a second
thread in a call on the same communicator at once raises MismatchError on every rank, as MPI needs
one order of the collectives on a communicator (docs/design.md, "Threads")."""

from __future__ import annotations

from mpi4py import MPI

from .mismatch import UNKNOWN, everywhere
from .stalls import WAITING
from .state import comm_state, existing_state
from .threads import THREADED, enter_call, leave_call, note_thread

__all__ = ["one_caller"]


def one_caller(comm, run, *arguments):
    """run(*arguments), once several threads call ringtree, as the one thread in a call on `comm`
    (threads.enter_call): MismatchError on every rank if another thread is in a call on it too."""
    communicator = MPI.COMM_WORLD if comm is None else comm
    if not THREADED[1] and note_thread(communicator):  # a second thread's first call: is the first in one on comm?
        first = getattr(WAITING[0], "state", None)  # what the first thread waits in (stalls.py)
        if first is not None and first is existing_state(communicator):
            second_thread(comm, THREADED[0])
    inside = enter_call(comm, second_thread)
    try:
        result = run(*arguments)
    finally:
        other = leave_call(inside)
    if other is not None:
        second_thread(comm, other)
    return result


def second_thread(comm, other: int):
    """Raise MismatchError on every rank: a second thread calls on `comm` while thread `other` is in a
    call on it (it raises too, once the other ranks have)."""
    state = comm_state(MPI.COMM_WORLD if comm is None else comm)
    reason = ("two threads were in calls on it at once; MPI needs one order of collectives on a communicator, which "
              "two threads do not give: let each thread use a communicator of its own (comm.Dup())")
    raise everywhere(state, state.calls, UNKNOWN, reason, reason)
