"""MPI's errors as ringtree's: a message larger or smaller than its receive, a failed peer."""

from __future__ import annotations

from mpi4py import MPI

from ..errors import MismatchError, PeerFailure

__all__ = ["PEER_FAILED", "error_classes", "translated", "wrong_size"]

PEER_FAILED = (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)


def wrong_size(comm, peer: int, got: int, expected: int) -> MismatchError:
    return MismatchError(f"ringtree allreduce on rank {comm.Get_rank()}: a message from rank {peer} has {got} bytes "
                         f"where this rank expects {expected}: the ranks disagree on the count, dtype or algorithm; "
                         "check=True (RINGTREE_CHECK=1) names them")


def error_classes(error: MPI.Exception, statuses: list) -> list[int]:
    """The error's class, and for MPI_ERR_IN_STATUS those of the statuses, in order."""
    if error.Get_error_class() != MPI.ERR_IN_STATUS:
        return [error.Get_error_class()]
    return [MPI.Get_error_class(status.Get_error()) for status in statuses]


def translated(classes: list[int], comm) -> Exception | None:
    """ringtree's error for MPI error classes it understands: a message larger than its receive, or
    a failed peer; None for any other."""
    if MPI.ERR_TRUNCATE in classes:
        return _did_not_fit(comm)
    if any(c in PEER_FAILED for c in classes):
        return _peer_failure(comm)
    return None


def _peer_failure(comm) -> PeerFailure:
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
    return PeerFailure(f"ringtree allreduce on rank {comm.Get_rank()}: "
                       + (f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} failed" if failed
                          else "a rank failed (the MPI did not say which)")
                       + "; the communicator can be shrunk to the survivors (comm.Shrink()) to go on", failed)


def _did_not_fit(comm) -> MismatchError:
    return MismatchError(f"ringtree allreduce on rank {comm.Get_rank()}: a message was larger than its receive: "
                         "the ranks disagree on the count, dtype or algorithm; check=True (RINGTREE_CHECK=1) names them")
