"""The work of a call on ringtree's torch.distributed backend (torch_group.py): what `async_op=True`
returns, and what DDP and the functional collectives wait on from C++.

A work holds the requests of its call (ringtree's own, or a PointToPoint: MPI's own send or receive) and
what is left to do once they are done (copies out of a packed buffer, or out of the contiguous
stand-in of an output that is not contiguous). `wait()` waits for them as
any ringtree wait does. `get_future()` hands out a torch Future that completes without anyone
calling into ringtree, for C++ code (DDP's reducer) waits on it with no Python running:
- a work on host tensors is waited for at once, in the calling thread: on the CPU the ranks have
  a core each, which the backward pass needs; a thread spinning beside it cost DDP more than the
  overlap gave (docs/training.md);
- a work on CUDA tensors goes to the progress thread (runtime/engine/in_flight.py), which waits for it as
  it does for a Communicator's MPI requests, while the calling thread goes on queueing the GPU's
  work. The thread takes a work only when no other thread is waiting on it.
Either sets the Future's result, or its exception.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import torch
import torch.distributed as dist
from mpi4py import MPI

from ..errors import TimeoutError
from ..runtime.engine.in_flight import IN_FLIGHT, progress_others
from ..runtime.safety.backoff import wait_until
from ..runtime.safety.stalls import watched
from .request import Request

__all__ = ["Work", "PointToPoint"]


class Work(dist._Work):
    """The work of one call: `wait()`, `is_completed()`, `get_future()` (its value: `result`)."""

    def __init__(self, requests: list, result, then=None, settled=None) -> None:
        """`requests`: what to wait for (None: a part done already); `settled()`, once they are done, raises
        where the call cannot end well after all (a rank gave it up: reliability.check_given_up); then `then()`."""
        super().__init__()
        self._requests = [request for request in requests if request is not None]
        self._result, self._then, self._settled = result, then, settled
        self._lock = threading.Lock()
        self._completed = False
        self._failure: BaseException | None = None
        self._future: torch.futures.Future | None = None

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 (ringtree's own timeouts apply, docs/training.md)
        with self._lock:
            self._finish(by_owner=True)
        if self._future is not None:
            IN_FLIGHT.thread.forget(self)
        if self._failure is not None:
            raise self._failure
        return True

    def is_completed(self) -> bool:
        if self._completed:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another thread is waiting for it
        try:
            if not self._completed and all(request.test() for request in self._requests):
                self._finish(by_owner=True)
            return self._completed
        finally:
            self._lock.release()

    def is_success(self) -> bool:
        return self._completed and self._failure is None

    def exception(self):
        return self._failure

    def result(self):
        self.wait()
        return self._result

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._completed:
                    self._settle()
                elif _on_gpu(self._result):
                    IN_FLIGHT.thread.watch(self)
                else:
                    self._finish(by_owner=True)  # which settles it
        return self._future

    def advance(self) -> bool:
        """For the progress thread: wait for the work unless another thread is; whether it is complete."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._finish(by_owner=False)
            return True
        finally:
            self._lock.release()

    def _finish(self, by_owner: bool) -> None:
        """Wait for every request, then do what is left; an error ends the work. Under the lock."""
        if self._completed:
            return
        try:
            for request in self._requests:
                if by_owner or not isinstance(request, Request):
                    request.wait()
                else:
                    request._wait_for_another()  # noqa: SLF001 (the progress thread notes no thread)
            if self._settled is not None:
                self._settled()
            if self._then is not None:
                self._then()
        except Exception as error:  # any: wait() raises it, the Future carries it
            self._failure = error
        self._completed = True
        if self._future is not None:
            self._settle()

    def _settle(self) -> None:
        if self._failure is not None:
            self._future.set_exception(self._failure)
        else:
            self._future.set_result(self._result)


def _on_gpu(result) -> bool:
    """Whether the first tensor of `result` (a tensor, or lists of them) is on a GPU."""
    while isinstance(result, (list, tuple)) and result:
        result = result[0]
    return isinstance(result, torch.Tensor) and result.device.type != "cpu"


class PointToPoint:
    """MPI's own send or receive of a group, started by `start()` on the group's communicator: what a
    work tests and waits on. Its waits progress ringtree's collectives in flight, are watched for a
    stall, and keep `timeout`: past it, TimeoutError, a receive cancelled first (it must not land in
    the caller's memory later) and a send let go (MPI cannot cancel one that has begun; waiting for
    it could take for ever), its request and `buffers` kept in `abandoned` (MPI may read them later:
    a peer that comes late reads a large message straight from them). `what`: the call, as a warning
    or error names it; `receive`: whether it is a receive."""

    __slots__ = ("comm", "request", "done", "timeout", "what", "receive", "buffers", "abandoned")

    def __init__(self, comm, start, timeout: float | None = None, what: str = "MPI's own call",
                 receive: bool = False, buffers: tuple = (), abandoned: list | None = None) -> None:
        self.comm, self.request, self.done, self.timeout, self.what = comm, start(), False, timeout, what
        self.receive, self.buffers, self.abandoned = receive, buffers, abandoned

    def test(self) -> bool:
        if not self.done:
            progress_others()
            self.done = self.request.Test()
        return self.done

    def wait(self) -> None:
        if self.done:
            return
        deadline = None if self.timeout is None else time.perf_counter() + self.timeout

        def done() -> bool:
            if self.request.Test():
                return True
            if deadline is not None and time.perf_counter() > deadline:
                return self._let_go()
            return False
        watched(partial(wait_until, done, progress_others), f"{self.what} on rank {self.comm.Get_rank()}")
        self.done = True

    def _let_go(self) -> bool:
        """Past the timeout: a receive cancelled (True if it had matched all the same: it is done), a
        send let go; else TimeoutError."""
        try:
            if self.receive:
                self.request.Cancel()
                status = MPI.Status()
                self.request.Wait(status)
                if not status.Is_cancelled():
                    return True
            else:
                if self.abandoned is not None:
                    self.abandoned.append((self.request, self.buffers))
                self.request.Free()
        except MPI.Exception:
            pass
        raise TimeoutError(f"ringtree on rank {self.comm.Get_rank()}: {self.what} made no progress for "
                            f"{self.timeout:g} s")
