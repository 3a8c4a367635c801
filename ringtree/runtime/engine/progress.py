"""A thread that moves the collectives of requests that code may wait on inside MPI
(`MPI.Request.Waitall` on ringtree.Communicator's requests, request.MPIRequest): there no ringtree
call runs to progress them, so this thread waits for them as a ringtree wait does (progressing
every collective in flight, finding mismatches and failed peers) and completes their generalized
requests.

It runs only while such requests are pending, and never waits inside MPI. It takes a request only
when no other thread holds it (a wait by its owner), so that no two threads test one MPI request.
"""

from __future__ import annotations

import atexit
import threading

from ..safety.backoff import Backoff

__all__ = ["watch", "forget"]

_LIVE: dict = {}  # id -> an MPIRequest not yet complete (mpi4py's requests are not hashable)
_CONDITION = threading.Condition()
_THREAD: list = [None]
_STOPPING = [False]


def watch(request) -> None:
    """Progress `request` (its `advance()`) from the thread until it is complete."""
    with _CONDITION:
        _LIVE[id(request)] = request
        if _THREAD[0] is None:
            _THREAD[0] = threading.Thread(target=_run, name="ringtree-progress", daemon=True)
            _THREAD[0].start()
        _CONDITION.notify()


def forget(request) -> None:
    with _CONDITION:
        _LIVE.pop(id(request), None)


def _run() -> None:
    backoff = Backoff()  # the one back-off of every wait: the calling threads want the GIL and the cores
    while True:
        with _CONDITION:
            while not _LIVE and not _STOPPING[0]:
                _CONDITION.wait()
                backoff.moved()
            if _STOPPING[0]:
                return
            live = list(_LIVE.values())
        done = [request for request in live if request.advance()]
        if done:
            with _CONDITION:
                for request in done:
                    _LIVE.pop(id(request), None)
            backoff.moved()
        else:
            backoff.empty()


@atexit.register  # registered after mpi4py's own exit handler, so it runs first: before MPI_Finalize
def _stop() -> None:
    with _CONDITION:
        _STOPPING[0] = True
        _CONDITION.notify()
    if _THREAD[0] is not None:
        _THREAD[0].join(timeout=5)
