"""The file store: ``open_store("file:///abs/dir")``. See docs/file-store.md.

One process owns a root at a time (an OS lock enforces it). The root holds
``commits.ndjson`` (one newline-terminated, checksummed JSON record per accepted mutation,
fsynced before it is acknowledged, concurrent writers sharing one fsync), ``snapshot.json``
(written by compaction), ``stream-checkpoints/`` (one JSON file per run) and
``wakeful.lock``. Opening replays the snapshot and the log into the in-memory projection
every read is served from.

Modules: ``codec`` (line framing, file names, format versions), ``chain`` (what a log
record carries besides its mutation: sequence number, link, end of its write), ``log``
(replay, chain, torn tail and corruption rules, the appender), ``snapshot`` (the state as
JSON), ``root`` (which files win, opening, keeping torn bytes, upgrading version 1 logs,
compaction), ``lock``, ``iothread``, ``store`` (``FileStore``: group commit, failure
recovery), ``stream`` (stream checkpoints).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from wakeful.clock import Clock
from wakeful.errors import StoreUnavailable, UnsupportedStore
from wakeful.store.diskfull import full_disk
from wakeful.store.file.codec import STREAM_DIR
from wakeful.store.file.fsutil import fsync_dir, make_root
from wakeful.store.file.lock import RootLock
from wakeful.store.file.root import COMPACTION_STEPS, Loaded, load_root
from wakeful.store.file.store import DEFAULT_COMPACT_BYTES, FileStore, LogStats
from wakeful.store.file.stream import remove_stray_temp_files

OPTIONS = ("compact_bytes",)


def parse_file_url(url: str) -> Path:
    """The root directory named by a ``file:`` URL: ``file:///abs/dir`` (or
    ``file://localhost/abs/dir``), percent-decoded. Anything else is ``UnsupportedStore``."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "file":
        raise UnsupportedStore(url, "not a file: URL")
    if parts.netloc not in ("", "localhost"):
        raise UnsupportedStore(
            url,
            f"{parts.netloc!r} is read as a host name; a file store URL is file:/// followed "
            f"by an absolute directory path, e.g. file:///var/lib/app/store (relative paths "
            f"are refused: make the path absolute first)",
        )
    if parts.query or parts.fragment:
        raise UnsupportedStore(
            url, "a file store URL takes no query or fragment; pass options as keywords"
        )
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise UnsupportedStore(
            url,
            "the path must be absolute: file:///abs/dir (relative paths are refused because "
            "they would depend on the working directory)",
        )
    if "\x00" in path:
        raise UnsupportedStore(url, "the path contains a NUL byte")
    return Path(path)


async def open_file_store(url: str, *, clock: Clock | None = None, **options: Any) -> FileStore:
    """Open (creating it if needed) the file store at ``url``.

    Options: ``compact_bytes`` (default 64 MiB; ``None`` turns automatic compaction off):
    compact once the log is at least this long and at least as long as the last snapshot.

    Raises ``UnsupportedStore`` for a bad URL or option, ``StoreLocked`` if another opener
    holds the root, ``CorruptStore`` if a complete record is invalid (nothing is changed
    then) and ``StoreUnavailable`` if the root cannot be created, read or written.
    """
    root = parse_file_url(url)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UnsupportedStore(url, f"unknown options {unknown}; file:// takes {list(OPTIONS)}")
    compact_bytes = options.get("compact_bytes", DEFAULT_COMPACT_BYTES)
    if compact_bytes is not None and (
        isinstance(compact_bytes, bool) or not isinstance(compact_bytes, int) or compact_bytes < 1
    ):
        raise UnsupportedStore(url, "compact_bytes must be a positive integer or None")
    lock, loaded = await asyncio.to_thread(_open_root, root)
    return FileStore(root, lock, loaded, clock, compact_bytes)


def _open_root(root: Path) -> tuple[RootLock, Loaded]:
    try:
        make_root(root)
        lock = RootLock.acquire(root)
    except OSError as exc:
        raise _unavailable(root, exc) from exc
    loaded: Loaded | None = None
    try:
        loaded = load_root(root)
        stream_dir = root / STREAM_DIR
        if not stream_dir.is_dir():
            stream_dir.mkdir()
            fsync_dir(root)
        remove_stray_temp_files(stream_dir)
    except BaseException as exc:
        if loaded is not None:
            loaded.writer.close()
        lock.release()
        if isinstance(exc, OSError):
            raise _unavailable(root, exc) from exc
        raise
    return lock, loaded


def _unavailable(root: Path, exc: OSError) -> StoreUnavailable:
    advice = full_disk(exc) or "correct the absolute path, its ownership or the mount permissions"
    return StoreUnavailable(f"cannot open the file store at {root} ({exc}); {advice}, then reopen")


__all__ = [
    "COMPACTION_STEPS",
    "DEFAULT_COMPACT_BYTES",
    "FileStore",
    "LogStats",
    "open_file_store",
    "parse_file_url",
]
