"""Small blocking file-system helpers with the durability steps spelled out.

Everything here blocks; the store calls it from its IO thread or ``asyncio.to_thread``.
"""

from __future__ import annotations

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
