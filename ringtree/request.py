"""The Request of a collective in flight, as `iallreduce` returns it."""

from __future__ import annotations

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
    def Test(self) -> bool:
        return self.test()

    def Wait(self) -> bool:
        self.wait()
        return True
