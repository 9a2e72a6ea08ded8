"""The kinds of dispatch a store queues and the priority of a cancellation: constants every
backend shares, in a module of their own so that a backend does not import the projection
machinery of the memory and file stores to read them (about 2 MB of a PostgreSQL worker's
resident set, decision 0024)."""

from __future__ import annotations

CANCEL_PRIORITY = 2**31 - 1
"""Cancellation dispatches outrank all other work."""

DISPATCH_KINDS = frozenset(("start", "resume", "cancel", "message"))

__all__ = ["CANCEL_PRIORITY", "DISPATCH_KINDS"]
