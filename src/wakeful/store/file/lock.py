"""The exclusive lock that makes one opener own a root.

Two ``fcntl.flock`` locks, non-blocking, taken in this order: one on the root directory's own
file descriptor and one on ``<root>/wakeful.lock``; a second opener in another process gets
``StoreLocked`` at once. The directory lock is what ``rm wakeful.lock`` cannot take away: a
deleted (or replaced) lock file is a new inode that a second opener could lock, but the
directory it sits in is the same one, and its lock is still held (decision 0033). The lock
file stays for openers of earlier versions, which lock only it, and for operators (it holds
the owner's pid, space-padded; its content means nothing else).

Because an earlier version (or a file system that cannot flock a directory) relies on the
lock file alone, the holder also checks, before each group commit is written, that the file
at ``<root>/wakeful.lock`` is still the one it locked (``verify``: one ``stat``; the held
inode is read once, at acquire). A removed or replaced lock file (or a root directory moved
away and replaced) raises ``LockLost``: the store writes nothing more.

flock locks belong to an open file description, and where flock is emulated with
per-process ``fcntl`` locks (some network file systems) a second open in the same process
would not conflict, so openers in this process are also refused explicitly through a
registry keyed by the root directory's device and inode (a symlinked or differently spelled
path to the same directory is the same root).

The kernel drops the locks when the process dies, so a crashed owner never leaves the root
locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import weakref
from pathlib import Path

from wakeful.errors import StoreLocked
from wakeful.store.file.codec import LOCK_NAME

logger = logging.getLogger("wakeful.store.file")

_held: set[tuple[int, int]] = set()
_guard = threading.Lock()


class LockLost(Exception):
    """The lock file at the root is not the one this holder locked: the store must not
    write again (another opener may own the root now)."""


class RootLock:
    """Held from ``acquire`` until ``release`` (or garbage collection)."""

    def __init__(self, root: Path, fds: tuple[int, ...], key: tuple[int, int]) -> None:
        self.root = root
        self.path = root / LOCK_NAME
        st = os.fstat(fds[-1])
        self._identity = (st.st_dev, st.st_ino)
        self._finalizer = weakref.finalize(self, _release, fds, key)

    @classmethod
    def acquire(cls, root: Path) -> RootLock:
        """Lock ``root`` (an existing directory) or raise ``StoreLocked``. Blocking IO."""
        st = os.stat(root)
        key = (st.st_dev, st.st_ino)
        with _guard:
            if key in _held:
                raise StoreLocked(str(root))
            fds: list[int] = []
            try:
                directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                fds.append(directory)
                if not _lock_directory(root, directory):
                    fds.remove(directory)
                    os.close(directory)
                fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock = cls(root, tuple(fds), key)
            except BlockingIOError:
                _close(fds)
                raise StoreLocked(str(root)) from None
            except BaseException:
                _close(fds)
                raise
            _held.add(key)
        # The pid is a courtesy for operators (the flock is what counts); fixed width, so
        # rewriting it never changes the file's size.
        with contextlib.suppress(OSError):
            os.pwrite(fd, f"{os.getpid():<19}\n".encode(), 0)
        return lock

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def verify(self) -> None:
        """Raise ``LockLost`` unless ``<root>/wakeful.lock`` is the file this lock holds.
        One ``stat``; blocking IO (the store calls it on its IO thread before each write)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise LockLost(
                f"the lock file {self.path} was removed while this store held it"
            ) from None
        if (st.st_dev, st.st_ino) != self._identity:
            raise LockLost(
                f"the lock file {self.path} was replaced while this store held it (or the "
                f"root directory was moved away and another put in its place)"
            )

    def release(self) -> None:
        """Unlock; idempotent."""
        self._finalizer()


def _lock_directory(root: Path, fd: int) -> bool:
    """flock the directory; False (and the lock file alone guards the root) where the file
    system cannot lock a directory. Raises ``BlockingIOError`` if another opener holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise
    except OSError as exc:  # e.g. NFS emulates flock with fcntl locks, which need a writer
        logger.warning(
            "%s: cannot lock the directory itself (%s); only %s guards the root, so never "
            "delete it while the store is open",
            root,
            exc,
            LOCK_NAME,
        )
        return False
    return True


def _close(fds: list[int]) -> None:
    for fd in reversed(fds):
        os.close(fd)


def _release(fds: tuple[int, ...], key: tuple[int, int]) -> None:
    with _guard:
        _held.discard(key)
        try:
            for fd in reversed(fds):
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            _close(list(fds))
