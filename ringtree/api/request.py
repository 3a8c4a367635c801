"""The Request of a collective in flight, as `iallreduce` returns it; MPIRequest, the same as an
mpi4py request, as ringtree.Communicator's Iallreduce returns it."""

from __future__ import annotations

import sys
import threading
import time

from mpi4py import MPI

from ..debug import log
from ..runtime.engine.in_flight import IN_FLIGHT
from ..runtime.engine.native import NativeInFlight
from ..runtime.engine.pipelined import Execution
from ..runtime.safety.threads import note_thread

__all__ = ["Request", "MPIRequest"]


class Request:
    """A collective in flight. `wait()` returns the result array; `test()` says whether it is done.
    `execution`: what it tests and waits on (engine.Execution, NativeInFlight or EmptyCall)."""

    __slots__ = ("execution", "_result", "_then")

    def __init__(self, execution: Execution | NativeInFlight, result, then=None) -> None:
        self.execution = execution
        self._result = result
        self._then = then  # what is left to do once the execution is done

    def test(self) -> bool:
        note_thread(self.execution.comm)
        done = self.execution.test()
        if done and self._then is not None:
            self._finish()
        return done

    def wait(self):
        note_thread(self.execution.comm)
        self.execution.wait()
        if self._then is not None:
            self._finish()
        return self._result

    def _wait_for_another(self) -> None:
        """wait() in the progress thread (in_flight.py), which makes no call: no thread is noted."""
        self.execution.wait()
        if self._then is not None:
            self._finish()

    def _finish(self) -> None:
        then, self._then = self._then, None
        then()

    # mpi4py's spelling, for code written against MPI.Request.
    def Test(self, status: MPI.Status | None = None) -> bool:
        done = self.test()
        if done and status is not None:
            empty_status(status)
        return done

    def Wait(self, status: MPI.Status | None = None) -> bool:
        self.wait()
        if status is not None:
            empty_status(status)
        return True


class MPIRequest(MPI.Grequest):
    """A ringtree Request that is also an mpi4py request (a generalized request, MPI_Grequest_start):
    MPI.Request.Waitall, Waitany, Testall, ... take it beside MPI's own. While one waits inside MPI,
    where no ringtree call progresses the collective, the progress thread (runtime/engine/in_flight.py)
    moves it and completes the generalized request. Its own Wait and Test progress it as a Request's."""

    def __new__(cls, request: Request) -> MPIRequest:
        failure: list = []  # the error that ended it in the progress thread, for MPI's status and for Wait
        self = super().__new__(cls, MPI.Grequest.Start(_status, _nothing, _nothing, args=(failure,)))
        self._request, self._lock, self._completed, self._failure = request, threading.Lock(), False, failure
        IN_FLIGHT.thread.watch(self)
        return self

    def advance(self) -> bool:
        """For the progress thread: wait for it, unless another thread holds it; whether it is complete.
        The wait is a ringtree wait, which finds a mismatch, a timeout or a failed peer; an error ends
        it: a wait inside MPI then fails (MPI_ERR_IN_STATUS), and its own Wait raises the error."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if not self._completed:
                try:
                    self._request._wait_for_another()
                except Exception as error:  # any: its own Wait raises it
                    log.error("%s", error)  # someone waiting inside MPI learns only that it failed
                    self._failure.append(error)
                self._complete()
            return True
        finally:
            self._lock.release()

    def _complete(self) -> None:
        self._completed = True
        MPI.Grequest.Complete(self)

    def Wait(self, status: MPI.Status | None = None) -> bool:
        with self._lock:
            if not self._completed:
                try:
                    self._request.wait()
                finally:
                    self._complete()
        IN_FLIGHT.thread.forget(self)
        if self._failure:
            try:
                MPI.Grequest.Wait(self)  # frees it; its query reports the failure to MPI, which raises
            except MPI.Exception:
                pass
            raise self._failure[0]
        return MPI.Grequest.Wait(self, status)  # frees it; at once where MPI has already

    def Test(self, status: MPI.Status | None = None) -> bool:
        if not self._lock.acquire(blocking=False):
            return False  # the progress thread is waiting for it
        try:
            if not self._completed:
                try:
                    if self._request.test():
                        self._complete()
                except BaseException:
                    self._complete()
                    raise
        finally:
            self._lock.release()
        if self._completed and self._failure:
            return self.Wait(status)
        return self._completed and MPI.Grequest.Test(self, status)

    def wait(self):
        """The result, as Request.wait."""
        self.Wait()
        return self._request._result

    def test(self) -> bool:
        return self.Test()


def _status(status: MPI.Status, failure: list) -> None:
    """A generalized request's query callback: the empty status, with an error if it failed. The error
    is an exception (mpi4py returns its code to MPI, whose wait raises it), which mpi4py also prints
    with its traceback: ringtree's error was logged already, so this thread's stderr is quiet until
    it has been printed."""
    empty_status(status)
    if failure:
        status.error = MPI.ERR_OTHER
        if not isinstance(sys.stderr, _Quiet):
            sys.stderr = _Quiet(sys.stderr)
        raise MPI.Exception(MPI.ERR_OTHER)


class _Quiet:
    """sys.stderr, but for what the thread that made it writes within QUIET_SECONDS (mpi4py's print of
    the query's exception, at once); after that, or from another thread, sys.stderr as it was, which
    the first write then puts back."""

    QUIET_SECONDS = 0.05

    def __init__(self, stream) -> None:
        self._stream, self._thread = stream, threading.get_ident()
        self._until = time.monotonic() + self.QUIET_SECONDS

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread and time.monotonic() < self._until:
            return len(text)
        if sys.stderr is self:
            sys.stderr = self._stream
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def empty_status(status: MPI.Status) -> None:
    """The status of a completed collective: MPI's empty status (the MPI standard, 3.7.3)."""
    status.source, status.tag, status.error = MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.SUCCESS
    status.Set_elements(MPI.BYTE, 0)
    status.Set_cancelled(False)


def _nothing(*_) -> None:
    """A generalized request's free and cancel callbacks: a collective cannot be cancelled, and
    what it holds is freed with its Request."""
