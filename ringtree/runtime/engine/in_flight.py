"""Every request in flight in this process, with the op of the collective it belongs to: a wait on
any collective polls them all, so outstanding calls progress together and in any order, in any
thread (LOCK keeps the lists whole).

IN_FLIGHT.thread moves the collectives of requests that code may wait on inside MPI
(`MPI.Request.Waitall` on ringtree.Communicator's requests, request.MPIRequest): there no ringtree
call runs to progress them, so this thread waits for them as a ringtree wait does (progressing
every collective in flight, finding mismatches and failed peers) and completes their generalized
requests. It runs only while such requests are pending, and never waits inside MPI. It takes a
request only when no other thread holds it (a wait by its owner), so that no two threads test one
MPI request."""

from __future__ import annotations

import atexit
import threading
import time

from mpi4py import MPI

from ...errors import MismatchError, PeerFailure
from ...schedule import OpKind
from ...schedule.collectives import COLLECTIVES
from ..safety import reliability
from ..safety.backoff import Backoff
from ..safety.failures import NOT_FAILED, error_classes, failing, job_ends, source, translated, wrong_size
from ..safety.stalls import slot
from ..safety.watch import Watch
from ..transports.ipc import MessageError, WrongSize, mismatch
from ..transports.remote_sends import RemoteSends

__all__ = ["InFlight", "IN_FLIGHT", "LOCK", "progress_others"]

# An execution is an engine.Execution (which imports this module): only its methods are called here.

BYTE = MPI.BYTE
SEND, RECV = OpKind.SEND, OpKind.RECV


class InFlight:
    """Every request in flight in this process, with the op it belongs to: any wait progresses all."""

    def __init__(self) -> None:
        self.requests: list[MPI.Request] = []
        self.owners: list[tuple] = []
        self.statuses: list[MPI.Status] = []  # Testsome fills them: the size of each message received
        self.queued: list[tuple] = []  # reductions and copies still running
        # Executions neither done nor abandoned. Not `requests`: that is empty for a moment between a
        # message's completion and the next one's post, in which another thread may look.
        self.running: set = set()
        self.remote_sends = RemoteSends()
        self.thread = ProgressThread()  # for requests waited on inside MPI

    def add(self, request: MPI.Request, execution, op: int) -> None:
        self.requests.append(request)
        self.owners.append((execution, op))

    def add_queued(self, work, execution, op: int) -> None:
        self.queued.append((work, execution, op))

    def ops_of(self, execution) -> list[int]:
        """`execution`'s ops in flight: messages, sends held for their turn, and queued work."""
        return sorted([op for owner, op in list(self.owners) if owner is execution]
                      + self.remote_sends.held_ops(execution)
                      + [op for _, owner, op in list(self.queued) if owner is execution])

    def poll(self) -> bool:
        """Handle the requests and queued work that completed, if any; say whether any had. Any
        thread may call it: LOCK keeps the lists whole."""
        with LOCK:
            return self._poll()

    def _poll(self) -> bool:
        finished_work = self.queued and self._poll_queued()
        if not self.requests:
            return bool(finished_work)
        try:
            finished = MPI.Request.Testsome(self.requests, self.statuses)
        except MPI.Exception as error:
            self._failed(error)
        if not finished:
            return bool(finished_work)
        self._completed(finished, self.statuses)
        return True

    def _completed(self, finished: list[int], statuses: list) -> None:
        """Requests at `finished` (ascending), with their statuses in that order, have completed:
        check each received message's size, take them out, and let their ops go on."""
        owners = self.owners
        done = [owners[i] for i in finished]
        for (execution, op), status in zip(done, statuses):
            action = execution.actions[op]
            if action[0] is RECV:
                expected = (action[3].stop - action[3].start) * execution.buffers[action[2]].itemsize
                if status.Get_count(BYTE) != expected:
                    Watch(execution.state, execution.seq, execution.signature, execution.abandon).fail(
                        wrong_size(action[1], status.Get_count(BYTE), expected))
        if len(finished) == len(owners):
            self.requests, self.owners = [], []
        else:
            for i in sorted(finished, reverse=True):
                del self.requests[i], owners[i]
        for execution, op in done:
            execution.op_done(op)

    def _failed(self, error: MPI.Exception):
        """Testsome failed: raise ringtree's error for the collective whose message failed, after the
        other requests it completed have gone on. Completed requests are null now, and their
        statuses in the order of their indices (MPICH and Open MPI do so)."""
        finished = [i for i, request in enumerate(self.requests) if request == MPI.REQUEST_NULL]
        in_status = error.Get_error_class() == MPI.ERR_IN_STATUS
        statuses = list(self.statuses[:len(finished)]) if in_status else []
        classes = error_classes(error, statuses)
        bad = failing(classes)
        at = finished[bad] if bad < len(finished) else 0  # not known: the oldest request's
        execution = self.owners[at][0]
        peer = source(statuses[bad], execution.comm) if in_status and bad < len(statuses) else None
        ours = translated(classes, execution.comm, execution.signature.collective, in_status, peer)
        if ours is None:
            raise error
        fine = [(i, status) for i, status, c in zip(finished, statuses, classes)
                if c in NOT_FAILED and self.owners[i][0] is not execution]
        if fine:  # the failed collective's requests, null or not, abandon takes out
            self._completed([i for i, _ in fine], [status for _, status in fine])
        if isinstance(ours, MismatchError):  # a message larger than its receive: every rank is told
            Watch(execution.state, execution.seq, execution.signature, execution.abandon).fail(str(ours))
        raise self.abandon(execution, ours) from None

    def _poll_queued(self) -> bool:
        done, running = [], []
        for entry in self.queued:
            try:
                finished = entry[0].done
            except (WrongSize, MessageError) as error:  # the ranks differ on the call, or on its arrays
                execution = entry[1]
                Watch(execution.state, execution.seq, execution.signature, execution.abandon).fail(mismatch(error))
            except RuntimeError as error:  # a peer's memory cannot be mapped
                raise self.abandon(entry[1], error) from None
            (done if finished else running).append(entry)
        if done:
            self.queued = running
            for _, execution, op in done:
                execution.op_done(op)
        return bool(done)

    def abandon(self, execution, error: Exception) -> Exception:
        """Give up on `execution`: cancel its receives (and its sends, when a peer failed: else MPI
        would wait for them at exit), and mark its communicator unusable with `error`, which is
        returned to raise."""
        for request, (owner, op) in zip(self.requests, self.owners):
            if owner is not execution or request == MPI.REQUEST_NULL or job_ends():
                continue
            try:
                if execution.actions[op][0] is RECV or isinstance(error, PeerFailure):
                    request.Cancel()
                    request.Wait()  # on a revoked communicator this returns (with an error) at once
                else:
                    request.Free()  # a send a live peer may still take: MPI drops it at exit
            except MPI.Exception:
                pass  # a peer failed, or the communicator is revoked: nothing more to undo
        for work, owner, _ in self.queued:
            if owner is execution and hasattr(work, "cancel"):  # messages of a transport
                work.cancel()
        self.remote_sends.drop(execution)
        freed = [execution.peer_keys[action[1]] for action in (execution.actions[op] for owner, op in self.owners
                                                              if owner is execution)
                 if action[0] is SEND and execution.remote[action[1]] and action[1] not in execution.transport_peers]
        keep = [k for k, (owner, _) in enumerate(self.owners) if owner is not execution]
        self.requests = [self.requests[k] for k in keep]
        self.owners = [self.owners[k] for k in keep]
        self.queued = [entry for entry in self.queued if entry[1] is not execution]
        self.running.discard(execution)
        execution.state.broken = execution.failed = error
        execution.state.abandoned.append(execution)  # its arrays: a send let go may still be read, a late message land
        for key in freed:  # its sends let go leave their places to others' held ones
            held = self.remote_sends.done(key)
            if held is not None:
                held[0].resume(held[1])
        return error

    def wait(self, execution) -> None:
        """Progress every collective in flight until `execution` is done. With its timeout, or its
        communicator's (CommState.timeout), raise TimeoutError once no message completes for that long,
        and meanwhile answer other ranks' questions about who is still here."""
        timeout = execution.timeout if execution.timeout is not None else execution.state.timeout
        backoff = Backoff()
        watch = None  # made once idle: it looks for signs of a mismatch (mismatch.py)
        last_progress = next_answer = time.perf_counter()
        waiting = slot()  # for the stall watchdog (stalls.py)
        waiting[0] = execution
        try:
            while not execution.done:
                with LOCK:  # released between polls: another thread's wait progresses this execution too
                    if execution.done:
                        break
                    if not self.requests and not self.queued:
                        raise RuntimeError("ringtree engine: a collective has ops left but nothing in flight")
                    try:
                        progressed = self._poll()
                    except (MismatchError, PeerFailure):
                        if execution.failed is None:  # another thread's collective failed: its wait raises it
                            continue
                        raise
                if execution.failed is not None:  # another thread's poll abandoned it
                    raise execution.failed
                if progressed:
                    backoff.moved()
                    waiting[1] += 1
                    if timeout is not None:
                        last_progress = time.perf_counter()
                    if watch is not None:  # its idle time starts again (it keeps the communicator's timeout too)
                        watch.started = time.perf_counter()
                    continue
                if timeout is not None:
                    now = time.perf_counter()
                    if now >= next_answer:
                        reliability.answer_questions(execution.state, execution.seq)
                        next_answer = now + reliability.ANSWER_EVERY_SECONDS
                    if now - last_progress > timeout:
                        with LOCK:
                            raise self.abandon(execution, reliability.execution_timed_out(
                                execution, self.ops_of(execution), timeout))
                if backoff.empty():
                    if watch is None:
                        # Another collective tells the others its signature once stalled: ranks that differ
                        # on its root or blocks may send each other nothing that a tag would show.
                        watch = Watch(execution.state, execution.seq, execution.signature, execution.abandon,
                                      announce=_differs_unseen(execution.signature.collective))
                    watch.look()
        finally:
            waiting[0] = None


def _differs_unseen(collective: str) -> bool:
    """Whether ranks that differ in a call of `collective` (its root or blocks) may send each other
    nothing that a tag would show."""
    kind = COLLECTIVES[collective]
    return kind.rooted or kind.blocks


def progress_others() -> bool:
    """Progress the collectives other calls have in flight, if any: a wait outside the engine (the
    stepwise path, MPI's own allreduce) in any thread must move them too. Say whether any moved.
    An error of one of them is left to its own wait (Execution.failed)."""
    if not (IN_FLIGHT.requests or IN_FLIGHT.queued):
        return False
    try:
        return IN_FLIGHT.poll()
    except (MismatchError, PeerFailure):
        return True


class ProgressThread:
    """The one thread: the requests it progresses (by id: mpi4py's requests are not hashable), the
    condition it sleeps on while there are none, itself once started, and whether the process ends."""

    def __init__(self) -> None:
        self.live: dict = {}
        self.condition = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopping = False

    def watch(self, request) -> None:
        """Progress `request` (its `advance()`) from the thread until it is complete."""
        with self.condition:
            self.live[id(request)] = request
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="ringtree-progress", daemon=True)
                self.thread.start()
            self.condition.notify()

    def forget(self, request) -> None:
        with self.condition:
            self.live.pop(id(request), None)

    def _run(self) -> None:
        backoff = Backoff()  # the one back-off of every wait: the calling threads want the GIL and the cores
        condition, live = self.condition, self.live
        while True:
            with condition:
                while not live and not self.stopping:
                    condition.wait()
                    backoff.moved()
                if self.stopping:
                    return
                pending = list(live.values())
            done = [request for request in pending if request.advance()]
            if done:
                with condition:
                    for request in done:
                        live.pop(id(request), None)
                backoff.moved()
            else:
                backoff.empty()

    def stop(self) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify()
        if self.thread is not None:
            self.thread.join(timeout=5)


IN_FLIGHT = InFlight()
atexit.register(IN_FLIGHT.thread.stop)  # registered after mpi4py's own exit handler, so it runs first: before MPI_Finalize
# Held while a thread touches IN_FLIGHT or starts an Execution; never while it waits in MPI.
LOCK = threading.RLock()
