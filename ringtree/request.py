"""The Request of a collective in flight, as `iallreduce` returns it."""

from __future__ import annotations

from mpi4py import MPI

from .runtime.engine import Execution
from .runtime.native import NativeInFlight
from .runtime.threads import note_thread

__all__ = ["Request"]


class Request:
    """A collective in flight. `wait()` returns the result array; `test()` says whether it is done."""

    __slots__ = ("_execution", "_result", "_then")

    def __init__(self, execution: Execution | NativeInFlight, result, then=None) -> None:
        self._execution = execution
        self._result = result
        self._then = then  # what is left to do once the execution is done

    def test(self) -> bool:
        note_thread(self._execution.comm)
        done = self._execution.test()
        if done and self._then is not None:
            self._finish()
        return done

    def wait(self):
        note_thread(self._execution.comm)
        self._execution.wait()
        if self._then is not None:
            self._finish()
        return self._result

    def _finish(self) -> None:
        then, self._then = self._then, None
        then()

    # mpi4py's spelling, for code written against MPI.Request.
    def Test(self, status: MPI.Status | None = None) -> bool:
        done = self.test()
        if done and status is not None:
            _empty(status)
        return done

    def Wait(self, status: MPI.Status | None = None) -> bool:
        self.wait()
        if status is not None:
            _empty(status)
        return True


def _empty(status: MPI.Status) -> None:
    """The status of a completed collective: MPI's empty status (the MPI standard, 3.7.3)."""
    status.source, status.tag, status.error = MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.SUCCESS
    status.Set_elements(MPI.BYTE, 0)
    status.Set_cancelled(False)
