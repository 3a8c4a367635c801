"""Per-communicator state: private duplicates for ringtree's messages, and a call counter.

The state is cached as an MPI attribute of the user's communicator, so it is
created once (collectively, at the first ringtree call on that communicator)
and freed with it.
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from functools import partial

import numpy as np
from mpi4py import MPI

from ... import settings
from ...debug import configure_debug_logging, log
from ...errors import MismatchError, TimeoutError
from ...schedule.collectives import COLLECTIVES
from ...schedule.topology import Topology
from ...tuning import cache, selector
from ...tuning.online import Tuner
from ...version import __version__
from ..engine import timeline
from ..engine.in_flight import progress_others
from ..engine.native import free_plan
from ..safety import stalls
from ..safety.backoff import wait_until
from ..safety.mismatch import TagLayout
from ..safety.threads import thread_token

NO_LAST = (object(), None)  # what no communicator, nor None, is


class Sessions:
    """This process's communicator states: the MPI attribute key they hang by (made at the first
    call); the last communicator used and its state, as one (comm, state) pair that a thread reads at
    once, so that a loop on one communicator skips the attribute look-up; the communicator (or None)
    whose kept runs a public function looked up last, with them (`kept`, likewise: again.kept_runs);
    per communicator being set up (by handle), the lock its set-up holds, so that two threads that
    both make a first call on it set it up once, the second waiting for the first instead of issuing
    its collectives too; the states in use, held weakly (a second thread makes every one forget its
    bound runs); and the states whose communicators messages may still reach (a broken call, an
    announcement), never freed."""

    __slots__ = ("keyval", "last", "kept", "setting_up", "set_up", "live", "never_freed")

    def __init__(self) -> None:
        self.keyval: int | None = None
        self.last: tuple = NO_LAST
        self.kept: tuple = NO_LAST
        self.setting_up = threading.Lock()  # one thread makes the keyval, or a communicator's lock
        self.set_up: dict[int, threading.Lock] = {}
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.never_freed: list = []


SESSIONS = Sessions()
NATIVE_PLANS = 64


class CommState:
    def __init__(self, comm: MPI.Comm, timeout: float | None) -> None:
        """Set up ringtree on `comm`, collectively; with a `timeout`, give up (TimeoutError) if not
        every rank joins within it."""
        name = comm.Get_name() or "comm"
        self.broken: Exception | None = None  # set by a mismatch, timeout or failure: not to be used again
        self.announced = False  # whether this rank told the others which call it waited in (mismatch.py)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        # Every rank must make the same choices: compare what they depend on, once per communicator.
        # A rank that cannot read its settings or load its table still takes part, so that none waits for it.
        failure = None
        try:
            current = settings.current()
            configure_debug_logging(MPI.COMM_WORLD.Get_rank())
            if current.timeline:
                timeline.start(current.timeline)
            stalls.watch(current.stall_warning)
            mine = (f"{selector.identity()}, RINGTREE_CHECK={int(current.check)}, RINGTREE_TUNE={current.tune}, "
                    f"RINGTREE_SIGNATURES={int(current.signatures)}, RINGTREE_TOPOLOGY={current.topology}, "
                    f"RINGTREE_TRANSPORT={current.transport}")
        except (OSError, ValueError) as error:
            failure, mine = error, f"no usable settings ({error})"
        self.plans: dict = {}  # per call shape: the Plan built on its first call
        # Calls kept for the calls after them: by public function and result array, runs bound to small
        # arrays (again.py); by arguments, and by shape (shapes.py).
        self.again: dict[str, dict] = {name: {} for collective in COLLECTIVES for name in (collective, "i" + collective)}
        self.repeats, self.shapes = {}, {}
        self.hook = None  # the DDP hooks' HookState where a hook's state is this communicator (api/torch.py)
        self.passed_through: dict = {}  # per signature: the plan of calls MPI's own computes (passed_through.py)
        self.transports: dict = {}  # device layer -> its transport, or None (runtime/transports/choice.py)
        # Nonblocking, so that a rank that never comes is a timeout, not a hang. Plain mpi4py ones, also
        # for a ringtree.Communicator (whose Idup makes its kind, with allreduces of ringtree's). The one
        # collective on the user's communicator is the first Idup; every later set-up step runs on
        # communicators no other thread holds yet, so its order is the same on every rank.
        self.comm, dup = MPI.Intracomm(comm).Idup()
        _wait(dup, timeout=timeout, rank=self.rank, name=name)
        self.control, control_dup = self.comm.Idup()  # for timeouts: who is still here is asked on this one
        digest = np.frombuffer(hashlib.sha256(mine.encode()).digest(), np.uint8)
        digests = np.empty((self.size, digest.size), np.uint8)
        _wait(control_dup, self.comm.Iallgather(digest, digests), timeout=timeout, rank=self.rank, name=name)
        self.name = f"ringtree({name})"  # also for the stall watchdog, which calls no MPI
        self.comm.Set_name(self.name)
        if (digests != digest).any():
            identities = self.comm.allgather(mine)  # every rank is here: say who differs
            self.free()
            groups: dict[str, list[int]] = {}
            for rank, identity in enumerate(identities):
                groups.setdefault(identity, []).append(rank)
            raise MismatchError(f"ringtree on rank {self.rank}: ranks of {name} would choose algorithms "
                                "differently: " + "; ".join(f"ranks {r}: {i}" for i, r in groups.items()))
        if failure is not None:
            self.free()
            raise type(failure)(f"ringtree on rank {self.rank}: {failure}")
        # Which ranks share a node as MPI says, for the IPC transport; the algorithms see it unless
        # RINGTREE_TOPOLOGY=flat.
        self.hosts = _topology(self.comm)
        here = self.hosts.node_of[self.rank]
        # Per peer: on another node, where ringtree's sends are synchronous and few at once (pipelined.py).
        self.remote = tuple(node != here for node in self.hosts.node_of)
        # Per peer: whom its count of sends in flight is kept under, in every communicator alike.
        self.peer_keys = _world_ranks(self.comm)
        self.send_copies: dict = {}  # the engine's copies of sends to another node, by size, for reuse
        self.topology = self.hosts if current.topology == "nodes" else Topology.flat(self.size)
        self.layout = TagLayout.of(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))  # the standard puts TAG_UB on COMM_WORLD only
        self.cycle, self.codes, self.mask = self.layout.calls, self.layout.codes, self.layout.codes - 1
        self.calls = 0
        # For one_caller.py: a bit flipped in every signature code while its calls are confirmed, as
        # calls after another thread's are; the thread that called last, and how many of its calls
        # are still to be confirmed; whether its first call is still to be confirmed.
        self.threads_bit, self.caller, self.to_confirm = 0, thread_token(), 0
        self.unconfirmed = True
        self.confirming: dict = {}  # thread -> the byte its confirmations allreduce and their bound run (small.py)
        self.exchanging: dict = {}  # thread -> the arrays its alltoalls' counts are summed in and their bound run (counts.py)
        self.answers, self._answers_lock, self.raised = [], threading.Lock(), set()  # send_control's; who raised MismatchError
        self.abandoned: list = []  # MPI collectives a mismatch left in flight, with the arrays they may write
        self.reports: dict = {}  # {call number: {rank: its report (mismatch.tell)}}: others' signatures
        self.given_up = None  # (call number, rank, why) of the earliest call another rank gave up (reliability.py)
        self.timeout = None  # seconds every wait on it keeps where its call has none (a torch group's: watch.py)
        self.refusals = 0  # calls every rank refused (mismatch.refused): they tell one refusal from the next
        self.tuner = None if current.tune == "off" else _tuner(self.comm, self.topology, current)
        self.signatures = current.signatures

    def send_control(self, message, rank: int, tag: int) -> None:
        """Send a message on the control communicator; its request kept until it is sent."""
        request = self.control.isend(message, rank, tag)
        with self._answers_lock:
            self.answers = [sent for sent in self.answers if not sent.Test()]
            self.answers.append(request)

    def forget_bound(self) -> None:
        """Forget the calls kept for the calls after them: a plan they may hold was freed, or their runs
        may wait inside MPI, which a call may no longer do."""
        for kept in self.again.values():
            kept.clear()
        self.repeats.clear()
        self.shapes.clear()

    def free(self) -> None:
        broken, self.broken = self.broken, ValueError("the communicator was freed")  # the repeat paths check it
        self.forget_bound()
        # Messages of the call that broke it, or this rank's word of which call it was in, may still be
        # unreceived: were its communicators freed, MPI could give their context to a new one, and the
        # messages to its receives.
        keep = broken is not None or self.announced
        if keep:
            SESSIONS.never_freed.append(self)
            return
        for plan in self.plans.values():
            if plan.native is not None:
                free_plan(plan.native)
        for own in self.passed_through.values():
            own.comm.Free()
        for transport in self.transports.values():
            if transport is not None:
                transport.close()
        self.comm.Free()
        self.control.Free()

    def check_usable(self) -> None:
        """Raise the error that broke this communicator's ringtree state, if one did."""
        if self.broken is not None:
            raise type(self.broken)(f"ringtree on rank {self.rank}: this communicator is unusable after: {self.broken}")

    def make_room(self) -> None:
        """Before a native plan is made: keep at most NATIVE_PLANS, each of which holds a communicator,
        freeing the oldest (plans are made at the same calls on every rank, so it is the same one), and
        with it the calls kept bound to arrays, which may hold it."""
        natives = [key for key, plan in self.plans.items() if plan.native is not None]
        if len(natives) >= NATIVE_PLANS:
            free_plan(self.plans.pop(natives[0]).native)
            self.forget_bound()

    def next_tag(self, code: int) -> int:
        """The tag of the next collective, of signature `code` (mismatch.py): ranks call collectives in
        the same order, so they agree on it if they agree on the call. Every call counts itself so, the
        engine's here and MPI's own where they start (native.py, empty.py): a message of one call is
        never taken for another's."""
        seq = self.calls
        self.calls = seq + 1
        return (seq % self.cycle) * self.codes + ((code ^ self.threads_bit) & self.mask)  # TagLayout.tag, inlined


def _topology(comm: MPI.Comm) -> Topology:
    """Which ranks of `comm` share a node, as MPI's shared-memory split says: each rank's node is named
    by its lowest rank. Collective; every rank is known to be here."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)  # ranks in comm's order: its rank 0 is the lowest
    try:
        lowest = node.Get_group().Translate_ranks([0], comm.Get_group())[0]
    finally:
        node.Free()
    return Topology.of(comm.allgather(lowest))


def _world_ranks(comm: MPI.Comm) -> tuple:
    """Each rank's rank in MPI.COMM_WORLD, or (comm, rank) for one outside it (a spawned process)."""
    world = MPI.COMM_WORLD.Get_group()
    group = comm.Get_group()
    try:
        ranks = group.Translate_ranks(list(range(comm.Get_size())), world)
    finally:
        group.Free()
        world.Free()
    return tuple(rank if rank != MPI.UNDEFINED else (comm.py2f(), peer) for peer, rank in enumerate(ranks))


def cache_identity(comm: MPI.Comm, topology: Topology) -> dict:
    """The tuning cache's identity of `comm` (tuning/cache.py); collective."""
    mpi = " ".join(MPI.Get_library_version().splitlines()[0].split())
    return cache.identity(comm.allgather(MPI.Get_processor_name()), topology.node_of, mpi, __version__)


def _tuner(comm: MPI.Comm, topology: Topology, current: settings.Settings) -> Tuner:
    """Online tuning for `comm`, starting from what the cache holds for its hosts and layout: rank 0
    reads the cache and sends it to the others, so all start alike; rank 0 writes what they commit."""
    who = cache_identity(comm, topology)
    path = cache.path_for(current.cache_dir, who)
    committed = cache.parse(comm.bcast(cache.read(path) if comm.Get_rank() == 0 else None), who)
    rank = comm.Get_rank()

    def keep(key, option) -> None:
        if rank == 0 and current.tune == "online":
            try:
                cache.write(path, who, tuner.committed)
            except OSError as error:
                log.warning("ringtree: cannot write the tuning cache %s: %s", path, error.strerror)

    nranks = comm.Get_size()
    tuner = Tuner(nranks, selector.table().model(nranks), committed, current.tune == "online", keep, topology.nodes)
    if committed:
        log.info("tuning cache %s: %d choices for %d ranks", path, len(committed), nranks)
    return tuner


def _free(comm, keyval, state) -> int:
    if SESSIONS.last[1] is state:
        SESSIONS.last = NO_LAST
    if SESSIONS.kept[1] is state.again:
        SESSIONS.kept = NO_LAST
    with SESSIONS.setting_up:
        SESSIONS.set_up.pop(comm.handle, None)
    if not MPI.Is_finalized():
        state.free()
    return MPI.SUCCESS


def _wait(*requests, timeout, rank, name) -> None:
    if timeout is None:  # the collectives in flight move meanwhile: a rank may wait in one for this one's part
        stalls.watched(partial(wait_until, lambda: MPI.Request.Testall(requests), progress_others),
                       f"the first ringtree collective on {name} (it sets ringtree up there) on rank {rank}")
        return
    deadline = time.perf_counter() + timeout

    def arrived() -> bool:
        if MPI.Request.Testall(requests):
            return True
        if time.perf_counter() > deadline:
            raise TimeoutError(f"ringtree on rank {rank}: not every rank of {name} came to its first ringtree "
                               f"collective within {timeout:g} s (which ranks is not known before that "
                               "collective has set the communicator up)")
        return False

    wait_until(arrived, progress_others)


def forget_waits_inside_mpi() -> None:
    """Once several threads call: forget the kept calls of the communicators without signatures, whose
    runs may wait inside MPI, which no call may then do (again.may_keep)."""
    with SESSIONS.setting_up:
        states = list(SESSIONS.live)
    for state in states:
        if not state.signatures:
            state.forget_bound()


def existing_state(comm: MPI.Comm) -> CommState | None:
    """`comm`'s state if ringtree has set it up, without setting it up (none for a null communicator, which
    a call's checks then refuse by name)."""
    last = SESSIONS.last
    if comm is last[0]:
        return last[1]
    keyval = SESSIONS.keyval
    if keyval is None or not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        return None
    return comm.Get_attr(keyval)


def comm_state(comm: MPI.Comm, timeout: float | None = None) -> CommState:
    last = SESSIONS.last
    if comm is last[0]:
        return last[1]
    with SESSIONS.setting_up:
        if SESSIONS.keyval is None:
            SESSIONS.keyval = MPI.Comm.Create_keyval(delete_fn=_free)
    keyval = SESSIONS.keyval
    state = comm.Get_attr(keyval)
    if state is None:
        with SESSIONS.setting_up:
            setting_up = SESSIONS.set_up.setdefault(comm.handle, threading.Lock())
        # Collective, under this communicator's lock alone: a thread waiting here for the other ranks
        # must not keep another thread from setting up a communicator of its own.
        with setting_up:
            state = comm.Get_attr(keyval)
            if state is None:
                state = CommState(comm, timeout)
                comm.Set_attr(keyval, state)
                with SESSIONS.setting_up:
                    SESSIONS.live.add(state)
    SESSIONS.last = (comm, state)
    return state
