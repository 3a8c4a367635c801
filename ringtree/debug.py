"""RINGTREE_DEBUG=1: rank 0 logs ringtree's choices to stderr, each distinct one once."""

from __future__ import annotations

import logging

from . import settings

__all__ = ["log", "configure_debug_logging"]

log = logging.getLogger("ringtree")


def configure_debug_logging(rank: int) -> None:
    if settings.current().debug and rank == 0 and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("ringtree: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
