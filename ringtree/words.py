"""How ringtree's messages say a number of things: "1 element", "4 elements", "1 rank"."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, noun: str) -> str:
    """`count` and `noun`, plural where it is not one ("1 rank", "0 ranks", "3 ranks")."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
