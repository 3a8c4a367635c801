"""The errors ringtree raises when ranks disagree or stall."""

import builtins


class MismatchError(RuntimeError):
    """Ranks of one communicator disagree on something they must share; raised on every rank."""


class TimeoutError(builtins.TimeoutError):
    """A collective made no progress for its timeout. The message names the collective, its
    algorithm, the op and peer this rank waits for, and the ranks that are not in the collective.
    The communicator cannot be used for ringtree collectives afterwards."""
