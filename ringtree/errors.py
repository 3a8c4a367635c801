"""The errors ringtree raises when ranks disagree or stall."""

import builtins


class MismatchError(RuntimeError):
    """Ranks of one communicator disagree on something they must share; raised on every rank."""


class TimeoutError(builtins.TimeoutError):
    """A collective made no progress for its timeout. The message names the collective, its
    algorithm, the op and peer this rank waits for, and the ranks that are not in the collective:
    `missing` lists the ranks in no ringtree collective on the communicator, `elsewhere` maps the
    ranks in another one to its call number. `given_up_by`: where another rank timed out and gave
    the call up, which this rank then could not end alike, that rank (else None). The communicator
    cannot be used for ringtree collectives afterwards."""

    def __init__(self, message: str, missing: list[int] | None = None, elsewhere: dict[int, int] | None = None,
                 given_up_by: int | None = None) -> None:
        super().__init__(message)
        self.missing = missing or []
        self.elsewhere = elsewhere or {}
        self.given_up_by = given_up_by


class PeerFailure(RuntimeError):
    """Ranks of the communicator failed during a collective. `failed` lists their ranks. Under an
    MPI with ULFM fault tolerance (Open MPI's `mpiexec --with-ft ulfm`) the communicator can be
    shrunk to the survivors (`comm.Shrink()`) to go on; under another MPI, which can only fail the
    message with the dead rank, ringtree ends the job with MPI_Abort when this process exits."""

    def __init__(self, message: str, failed: list[int]) -> None:
        super().__init__(message)
        self.failed = failed
