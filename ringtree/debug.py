"""RINGTREE_DEBUG=1: rank 0 logs ringtree's choices to stderr, each distinct one once."""

from __future__ import annotations

import logging

from . import settings

__all__ = ["log", "configure_debug_logging", "Prefixed"]

log = logging.getLogger("ringtree")


class Prefixed(logging.Formatter):
    """"ringtree: " before a message, unless it names ringtree already: a warning says whose it is
    itself, as without RINGTREE_DEBUG logging's last resort prints it bare."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if message.startswith("ringtree") else f"ringtree: {message}"


def configure_debug_logging(rank: int) -> None:
    if settings.current().debug and rank == 0 and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(Prefixed("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
