"""ringtree's version, in a module of its own so that any part of the package may read it."""

__version__ = "0.1.0"
