"""Which threads call ringtree, and which is in a call on a communicator. Once a second thread has
called, every wait polls and progresses the collectives any thread has in flight, so threads may call
at once on communicators of their own; each call marks its thread as the one in a call on its
communicator, and a second thread in a call there at once is an error on every rank (docs/design.md,
"Threads").
"""

from __future__ import annotations

import threading

from mpi4py import MPI

__all__ = ["THREADS", "enter_call", "first_thread", "leave_call", "note_thread", "thread_token"]

get_ident = threading.get_ident


class Threads:
    """This process's marks of the threads that call ringtree: the first calling thread's ident and
    whether another has called since (`several`); while only the first has, the handle of the
    communicator it is in a call on (`first_in`) and that communicator once another thread has called
    on it meanwhile (`intruder`); once several have, who is in a call on which communicator
    (`inside`: handle -> [the thread, how deep: ringtree's own calls on it within the call, a thread
    that called meanwhile or None, the handle])."""

    __slots__ = ("first", "several", "first_in", "intruder", "inside", "tokens", "claiming")

    def __init__(self) -> None:
        self.first: int | None = None
        self.several = False
        self.first_in: int | None = None
        self.intruder = None
        self.inside: dict[int, list] = {}
        self.tokens = threading.local()
        self.claiming = threading.Lock()


THREADS = Threads()
_LEVELS = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
           MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED"}


def thread_token() -> object:
    """An object of the calling thread's own: unlike its ident, which a thread started after it ends
    may get, never another thread's while it is held."""
    try:
        return THREADS.tokens.token
    except AttributeError:
        token = THREADS.tokens.token = object()
        return token


def first_thread(ident: int) -> int:
    """The first thread to call ringtree, which the thread `ident` becomes if none has yet: under a lock,
    so that of threads making their first calls at once only one takes the first thread's way
    (one_caller.in_call), whose marks (first_in) are its alone."""
    first = THREADS.first
    if first is None:
        with THREADS.claiming:
            if THREADS.first is None:
                THREADS.first = ident
            first = THREADS.first
    return first


def note_thread(comm: MPI.Comm) -> bool:
    """Record the calling thread; return whether a second thread has called ringtree. RuntimeError,
    before any message, when a second thread calls and MPI was initialised below MPI_THREAD_MULTIPLE."""
    ident = get_ident()
    if ident == first_thread(ident) or THREADS.several:
        return THREADS.several
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            f"ringtree on rank {comm.Get_rank()}: a second thread calls ringtree, but MPI was initialised with "
            f"{_LEVELS.get(level, level)}, which lets only one thread call MPI; initialise it with "
            "MPI_THREAD_MULTIPLE (mpi4py's default; mpi4py.rc.thread_level = 'multiple'), or call ringtree from "
            "the thread that first did")
    THREADS.several = True
    return True


def enter_call(comm, second) -> list | None:
    """Once several threads call ringtree: mark the calling thread as the one in a call on `comm`
    until `leave_call`. A thread that calls while another is in a call on the same communicator (an
    error in MPI: the ranks would not order its collectives alike) gets `second(comm, other thread)`,
    which raises. No lock: setdefault is atomic, and only the thread in the call changes or removes
    its entry, before its call returns, so a thread that finds another's entry has called while that
    call was not over."""
    handle = getattr(MPI.COMM_WORLD if comm is None else comm, "handle", None)
    if handle is None:  # not a communicator: the checks say so
        return None
    me = get_ident()
    inside = THREADS.inside.setdefault(handle, [me, 0, None, handle])
    if inside[0] != me:
        inside[2] = me
        second(comm, inside[0])
    inside[1] += 1
    return inside


def leave_call(inside: list | None) -> int | None:
    """End the call `enter_call` marked; return a thread that called on its communicator meanwhile
    (the caller raises as that thread did, when its call ends without an error: its result may be
    of another thread's call on the other ranks), or None."""
    if inside is None:
        return None
    inside[1] -= 1
    if inside[1] == 0:
        del THREADS.inside[inside[3]]
    return inside[2]
