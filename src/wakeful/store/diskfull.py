"""Naming a full disk in a store's error message: its cause and what to do about it.

A write that fails with ``ENOSPC`` (no space left on the device) or ``EDQUOT`` (the disk quota
is exhausted) is not fixed by correcting a path or a permission, and is fixed by freeing
space; every store that writes files says so, in the same words, through ``full_disk``.
"""

from __future__ import annotations

import errno

NO_SPACE = "no space is left on the device: free space on that file system"
"""The cause and the action for ``ENOSPC`` (and SQLite's ``SQLITE_FULL``)."""

NO_QUOTA = (
    "the disk quota of the store's user is exhausted: free space within the quota or raise it"
)
"""The cause and the action for ``EDQUOT``."""

_ADVICE = {errno.ENOSPC: NO_SPACE, errno.EDQUOT: NO_QUOTA}


def full_disk(exc: BaseException | None) -> str | None:
    """The cause and the action (one phrase) if ``exc``, or the exception it was raised from,
    is an ``OSError`` for a full file system or an exhausted quota; otherwise None."""
    seen = 0
    while exc is not None and seen < 8:  # a chain is short; a cycle must not hang us
        if isinstance(exc, OSError) and exc.errno in _ADVICE:
            return _ADVICE[exc.errno]
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
