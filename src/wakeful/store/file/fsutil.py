"""Small blocking file-system helpers with the durability steps spelled out.

Everything here blocks; the store calls it from its IO thread or ``asyncio.to_thread``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

Fault = Callable[[str], None]
"""A crash hook: called with a step's name, raises to simulate dying right there."""


def no_fault(point: str) -> None:
    """The default hook: does nothing."""


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` (creations, renames, unlinks) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a short write is not an error)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_synced(path: Path, data: bytes, fault: Fault = no_fault, step: str = "") -> None:
    """Create or replace ``path`` with ``data`` and fsync it (no rename, no directory sync).
    Calls ``fault(step + "_written")`` between the write and the fsync and
    ``fault(step + "_synced")`` after it, when ``step`` is given."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        if step:
            fault(f"{step}_written")
        os.fsync(fd)
    finally:
        os.close(fd)
    if step:
        fault(f"{step}_synced")


def replace_durably(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``: temp file, fsync, rename, directory fsync.
    A crash leaves either the old content or the new one (and maybe a stray temp file)."""
    tmp = path.with_name(path.name + ".tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def make_root(root: Path) -> None:
    """Create ``root`` (and its parents) if needed; a new directory's entry is fsynced in its
    parent so it survives a crash."""
    if root.is_dir():
        return
    missing: list[Path] = []
    probe = root
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    os.makedirs(root, exist_ok=True)
    for created in reversed(missing):
        fsync_dir(created.parent)


def keep_aside(base: Path, data: bytes) -> Path:
    """Save ``data`` durably in a new file named ``base`` (or ``base-1``, ``base-2``, ... if
    that name holds other bytes) and fsync it and its directory; returns its path. A file
    of that family that already holds exactly ``data`` (saved by an earlier attempt that
    died before it could use it) is made durable and reused, so a retried open does not
    multiply copies. Never overwrites a file."""
    for n in itertools.count():
        path = base if n == 0 else base.with_name(f"{base.name}-{n}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            if path.read_bytes() != data:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        else:
            try:
                write_all(fd, data)
            except BaseException:
                os.close(fd)
                os.unlink(path)  # a partial copy; the bytes are still where they came from
                raise
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(path.parent)
        return path
    raise AssertionError("unreachable")  # pragma: no cover - count() never ends
