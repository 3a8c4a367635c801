"""MPI's errors as ringtree's: a message larger or smaller than its receive, a failed peer."""

from __future__ import annotations

import atexit

from mpi4py import MPI

from ...debug import log
from ...errors import MismatchError, PeerFailure

__all__ = ["PEER_FAILED", "error_classes", "failing", "job_ends", "source", "translated", "wrong_size"]

PEER_FAILED = (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)
NOT_FAILED = (MPI.SUCCESS, MPI.ERR_PENDING)


def wrong_size(peer: int, got: int, expected: int) -> str:
    """What a rank saw when a message is of another size than its receive (mismatch.everywhere raises it)."""
    return f"a message from rank {peer} has {got} bytes where this rank expects {expected}"


def error_classes(error: MPI.Exception, statuses: list) -> list[int]:
    """The error's class, and for MPI_ERR_IN_STATUS those of the statuses, in order."""
    if error.Get_error_class() != MPI.ERR_IN_STATUS:
        return [error.Get_error_class()]
    return [MPI.Get_error_class(status.Get_error()) for status in statuses]


def failing(classes: list[int]) -> int:
    """The index of the first class that is an error (0 when none is)."""
    return next((i for i, c in enumerate(classes) if c not in NOT_FAILED), 0)


def translated(classes: list[int], comm, collective: str, on_a_message: bool = False,
               peer: int | None = None) -> Exception | None:
    """ringtree's error for MPI error classes in a call of `collective` (its name): a message larger
    than its receive, a failed peer (ULFM), or, `on_a_message`, any other error on one of the
    collective's messages (with `peer`, where it is known); None for any other error."""
    if MPI.ERR_TRUNCATE in classes:
        return _did_not_fit(comm, collective)
    if any(c in PEER_FAILED for c in classes):
        return _peer_failure(comm, collective)
    if on_a_message:
        return _peer_lost(comm, collective, peer, classes[failing(classes)])
    return None


def source(status: MPI.Status, comm) -> int | None:
    """The rank a failed message was received from; None for a send, whose status names none."""
    rank = status.Get_source()
    return rank if 0 <= rank < comm.Get_size() else None


def _peer_failure(comm, collective: str) -> PeerFailure:
    """Which ranks failed, as far as this rank knows; and revoke ringtree's communicator, so that the
    survivors still waiting on it stop too, and raise this as well."""
    try:
        group = comm.Get_failed()
        failed = list(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), comm.Get_group()))
        group.Free()
    except MPI.Exception:
        failed = []
    try:
        comm.Revoke()
    except MPI.Exception:
        pass
    return PeerFailure(f"ringtree {collective} on rank {comm.Get_rank()}: "
                       + (f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} failed" if failed
                          else "a rank failed (the MPI did not say which)")
                       + "; the communicator can be shrunk to the survivors (comm.Shrink()) to go on", failed)


def _peer_lost(comm, collective: str, peer: int | None, error_class: int) -> PeerFailure:
    """An MPI without ULFM failed a message with `peer`: that rank most likely died, and its
    launcher may not end the job before this rank's MPI_Finalize waits for it forever. End the job
    when this process exits. (MPICH's revoke without fault tolerance crashes or hangs the survivors'
    requests, so no revoke.)"""
    _end_the_job_at_exit(comm)
    which = f"rank {peer}" if peer is not None else "a rank"
    return PeerFailure(f"ringtree {collective} on rank {comm.Get_rank()}: the MPI failed a message with {which} "
                       f"({MPI.Get_error_string(error_class)}): that rank has most likely died. This MPI cannot go "
                       "on without it, so ringtree ends the job (MPI_Abort) when this process exits",
                       [] if peer is None else [peer])


def _end_the_job_at_exit(comm) -> None:
    if not _ENDING_THE_JOB:
        _ENDING_THE_JOB.append(comm.Get_rank())
        atexit.register(_end_the_job)  # after mpi4py's own exit handler, so it runs before MPI_Finalize


_ENDING_THE_JOB: list[int] = []  # this process's rank on the communicator that lost a peer, once it has


def job_ends() -> bool:
    """Whether this process ends the job at exit: then its requests are left alone, as an MPI
    without fault tolerance may crash or wait forever on those with a dead peer."""
    return bool(_ENDING_THE_JOB)


def _end_the_job() -> None:
    log.error("ringtree on rank %d: a peer died during a collective; ending the job (MPI_Abort) instead of "
              "waiting for it in MPI_Finalize", _ENDING_THE_JOB[0])
    MPI.COMM_WORLD.Abort(1)


def _did_not_fit(comm, collective: str) -> MismatchError:
    return MismatchError(f"ringtree {collective} on rank {comm.Get_rank()}: a message was larger than its receive")
