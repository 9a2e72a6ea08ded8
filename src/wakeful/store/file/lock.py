"""The exclusive lock that makes one opener own a root.

``fcntl.flock`` on ``<root>/wakeful.lock``, non-blocking: a second opener in another process
gets ``StoreLocked`` at once. flock locks belong to an open file description, and where flock
is emulated with per-process ``fcntl`` locks (some network file systems) a second open in the
same process would not conflict, so openers in this process are also refused explicitly
through a registry keyed by the root directory's device and inode (a symlinked or
differently spelled path to the same directory is the same root).

The kernel drops the lock when the process dies, so a crashed owner never leaves the root
locked. The lock file holds the owner's pid (space-padded) for operators; its content means nothing
else.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from pathlib import Path

from wakeful.errors import StoreLocked
from wakeful.store.file.codec import LOCK_NAME

_held: set[tuple[int, int]] = set()
_guard = threading.Lock()


class RootLock:
    """Held from ``acquire`` until ``release`` (or garbage collection)."""

    def __init__(self, root: Path, fd: int, key: tuple[int, int]) -> None:
        self.root = root
        self._finalizer = weakref.finalize(self, _release, fd, key)

    @classmethod
    def acquire(cls, root: Path) -> RootLock:
        """Lock ``root`` (an existing directory) or raise ``StoreLocked``. Blocking IO."""
        st = os.stat(root)
        key = (st.st_dev, st.st_ino)
        with _guard:
            if key in _held:
                raise StoreLocked(str(root))
            fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise StoreLocked(str(root)) from None
            except BaseException:
                os.close(fd)
                raise
            _held.add(key)
        # The pid is a courtesy for operators (the flock is what counts); fixed width, so
        # rewriting it never changes the file's size.
        with contextlib.suppress(OSError):
            os.pwrite(fd, f"{os.getpid():<19}\n".encode(), 0)
        return cls(root, fd, key)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        """Unlock; idempotent."""
        self._finalizer()


def _release(fd: int, key: tuple[int, int]) -> None:
    with _guard:
        _held.discard(key)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
