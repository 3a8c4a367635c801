"""Per-communicator state: a private duplicate for ringtree's messages, and a call counter.

The state is cached as an MPI attribute of the user's communicator, so it is
created once (collectively, at the first ringtree call on that communicator)
and freed with it.
"""

from __future__ import annotations

from mpi4py import MPI

from . import selector
from .errors import MismatchError

_keyval: int | None = None
# The last communicator used and its state: a loop on one communicator skips the attribute lookup.
_last: tuple[MPI.Comm | None, "CommState | None"] = (None, None)


class CommState:
    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm.Dup()
        name = comm.Get_name() or "comm"
        self.comm.Set_name(f"ringtree({name})")
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        selector.configure_debug_logging(MPI.COMM_WORLD.Get_rank())
        # Every rank must make the same choices: compare what they depend on, once per communicator.
        # A rank that cannot load its table still takes part, so that none waits for it.
        try:
            mine = selector.identity()
        except (OSError, ValueError) as error:
            mine = f"no usable tuning setup ({error})"
        identities = self.comm.allgather(mine)
        if len(set(identities)) > 1:
            self.comm.Free()
            groups: dict[str, list[int]] = {}
            for rank, identity in enumerate(identities):
                groups.setdefault(identity, []).append(rank)
            raise MismatchError(f"ringtree on rank {self.rank}: ranks of {name} would choose algorithms "
                                "differently: " + "; ".join(f"ranks {r}: {i}" for i, r in groups.items()))
        if mine.startswith("no usable"):
            self.comm.Free()
            raise ValueError(f"ringtree on rank {self.rank}: {mine}")
        self.tags = min(comm.Get_attr(MPI.TAG_UB), 1 << 30) + 1
        self.calls = 0
        self.plans: dict = {}  # per call shape: what allreduce.iallreduce built on the first call

    def next_tag(self) -> int:
        """A tag for the next collective: ranks call collectives in the same order, so they agree."""
        tag = self.calls % self.tags
        self.calls += 1
        return tag


def _free(comm, keyval, state) -> int:
    global _last
    if _last[1] is state:
        _last = (None, None)
    if not MPI.Is_finalized():
        state.comm.Free()
    return MPI.SUCCESS


def comm_state(comm: MPI.Comm) -> CommState:
    global _keyval, _last
    if comm is _last[0]:
        return _last[1]
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_free)
    state = comm.Get_attr(_keyval)
    if state is None:
        state = CommState(comm)
        comm.Set_attr(_keyval, state)
    _last = (comm, state)
    return state
