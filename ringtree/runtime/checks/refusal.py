"""A call that one rank refuses: the other ranks of the call raise too, naming it.

A rank whose arguments fail the checks raises before any message of the call, but the other ranks
may have made the call with arguments of their own and wait for it. So the refusing rank tells each
of them, on the communicator's ringtree state (created, collectively, if this is its first call), and
waits until each has answered (mismatch.refused): refused the call too, which leaves the
communicator as it was, since nothing of the call was sent; or raised MismatchError, naming this
rank and its reason, on learning of it while waiting in the call. Then the communicator is unusable
on every rank, as after any mismatch, and this rank raises its own error.
"""

from __future__ import annotations

import re

from mpi4py import MPI

from ..safety.mismatch import refused
from ..safety.stalls import watched
from ..session.state import comm_state, existing_state
from ..transports.backend import NoDevice

__all__ = ["REFUSALS", "refusing", "tell_others"]

REFUSALS = (TypeError, ValueError, NoDevice)  # what the checks raise (a SettingError is a ValueError)
_PREFIX = re.compile(r"^ringtree \w+(?: on rank \d+)?: ")


class refusing:
    """Around a call's checks: a refusal of them is told to the other ranks of `comm` before it is raised
    (a class, not a generator: it is on the path of every call that is checked)."""

    __slots__ = ("comm",)

    def __init__(self, comm) -> None:
        self.comm = comm

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is not None and issubclass(kind, REFUSALS):
            tell_others(self.comm, error)
        return False  # raised on


def tell_others(comm, error: Exception) -> None:
    """This rank refuses its call on `comm` with `error`: tell the other ranks (see above). Nothing to
    tell where `comm` is no communicator to send on, or has no other rank."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL or comm.Get_size() == 1:
        return
    state = existing_state(comm)
    if state is None:
        try:
            state = comm_state(comm)  # the other ranks set it up in their call: this one takes part
        except Exception:  # noqa: BLE001 - a set-up that fails (settings that differ) raises on every rank
            return
    if state.broken is not None:
        return
    why = _PREFIX.sub("", str(error))
    watched(lambda: refused(state, state.calls, why),
            f"a call it refused on rank {state.rank} of {state.name}, telling the other ranks ({why})")
