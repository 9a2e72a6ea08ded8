"""The Remote Hand's idempotency ledger: one SQLite file, one row per operation id.

Schema (table ``operations``)::

    operation_id TEXT PRIMARY KEY   -- the caller's operation id
    tool         TEXT NOT NULL
    arguments    TEXT NOT NULL      -- canonical JSON (sorted keys, no spaces)
    status       TEXT NOT NULL      -- 'started' | 'done'
    result       TEXT               -- JSON of the tool's result (done, no error)
    error        TEXT               -- 'Type: message' of the tool's exception (done)
    started_at   TEXT NOT NULL      -- ISO 8601, UTC
    finished_at  TEXT               -- ISO 8601, UTC (done)

The database runs in WAL mode with ``synchronous=FULL`` and autocommit, so each statement is
durable when it returns: ``start`` is on disk before the tool runs, ``finish`` before the
caller is answered. One process owns the file: ``flock`` on ``<ledger>.lock`` refuses a
second opener (``StoreLocked``); the kernel drops the lock when the owner dies.

Methods are blocking and thread-safe (one connection behind a lock); the service calls them
with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from wakeful.errors import InvalidState, StoreLocked

SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    operation_id TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('started', 'done')),
    result TEXT,
    error TEXT,
    started_at TEXT NOT NULL,
    finished_at TEXT
)
"""
_COLUMNS = "operation_id, tool, arguments, status, result, error, started_at, finished_at"


@dataclass(frozen=True)
class LedgerEntry:
    operation_id: str
    tool: str
    arguments: str
    status: Literal["started", "done"]
    result: str | None
    error: str | None
    started_at: str
    finished_at: str | None


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Ledger:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = _lock_file(self.path)
        try:
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(SCHEMA)
        except BaseException:
            self.close()
            raise

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise InvalidState("ledger", str(self.path), "closed", "open it again")
        return self._db

    def get(self, operation_id: str) -> LedgerEntry | None:
        with self._lock:
            row = (
                self._conn()
                .execute(
                    f"SELECT {_COLUMNS} FROM operations WHERE operation_id = ?", (operation_id,)
                )
                .fetchone()
            )
        return None if row is None else LedgerEntry(*row)

    def start(self, operation_id: str, tool: str, arguments: str) -> None:
        """Record the start; raises ``sqlite3.IntegrityError`` if the id is recorded."""
        with self._lock:
            self._conn().execute(
                "INSERT INTO operations (operation_id, tool, arguments, status, started_at) "
                "VALUES (?, ?, ?, 'started', ?)",
                (operation_id, tool, arguments, _now()),
            )

    def finish(self, operation_id: str, result: str | None, error: str | None) -> LedgerEntry:
        """Record the outcome of a started operation and return the finished entry."""
        with self._lock:
            db = self._conn()
            cursor = db.execute(
                "UPDATE operations SET status = 'done', result = ?, error = ?, finished_at = ? "
                "WHERE operation_id = ? AND status = 'started'",
                (result, error, _now(), operation_id),
            )
            if cursor.rowcount != 1:
                raise InvalidState("operation", operation_id, "not started", "cannot finish it")
            row = db.execute(
                f"SELECT {_COLUMNS} FROM operations WHERE operation_id = ?", (operation_id,)
            ).fetchone()
        return LedgerEntry(*row)

    def close(self) -> None:
        """Close the database and release the lock; idempotent."""
        with self._lock:
            if self._db is not None:
                self._db.close()
            self._db = None
            if self._lock_fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
                self._lock_fd = None


def _lock_file(path: Path) -> int:
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(str(path)) from None
    except BaseException:
        os.close(fd)
        raise
    return fd
