"""The errors ringtree raises when ranks disagree."""


class MismatchError(RuntimeError):
    """Ranks of one communicator disagree on something they must share; raised on every rank."""
