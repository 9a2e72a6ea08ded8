"""The SQLite store: the whole contract for many processes on one host.

Open it with ``open_store("sqlite:////abs/file.db")`` (or ``sqlite:///relative.db``); see
``docs/sqlite-store.md`` for the URL forms, pragmas, transaction model, clocks, waiting,
migrations, retention and limits.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote

from wakeful.clock import Clock, SystemClock
from wakeful.errors import UnsupportedStore
from wakeful.ids import check_count, check_seconds
from wakeful.store.sqlite.codec import to_us
from wakeful.store.sqlite.connection import Database
from wakeful.store.sqlite.migrations import shipped
from wakeful.store.sqlite.store import SqliteStore, SqliteStreamCheckpoints

PREFIX = "sqlite:///"
OPTIONS = {
    "busy_timeout": "seconds a write waits for another connection's write lock (default 5)",
    "readers": "reader connections, one per pool thread (default 4)",
    "poll_interval": "seconds between checks for other processes' commits while "
    "wait_events waits (default 0.025)",
}


def parse_url(url: str) -> str:
    """The file path named by a ``sqlite:///`` URL (SQLAlchemy's convention): three slashes
    then a relative path, four for an absolute one. Percent-escapes are decoded, so a path
    with spaces or ``?`` is written ``%20`` / ``%3F``."""
    if not isinstance(url, str) or url[: len(PREFIX)].lower() != PREFIX:
        raise UnsupportedStore(
            str(url),
            "a SQLite URL is sqlite:///relative/path.db or sqlite:////absolute/path.db",
        )
    rest = url[len(PREFIX) :]
    if "?" in rest or "#" in rest:
        raise UnsupportedStore(
            url,
            "SQLite URLs take no query or fragment; pass options as keyword arguments to "
            "open_store and percent-encode a '?' or '#' in the path (%3F, %23)",
        )
    path = unquote(rest, errors="strict")
    if not path or path.endswith("/"):
        raise UnsupportedStore(url, "the URL names no database file")
    if path == ":memory:" or path.startswith("file:"):
        raise UnsupportedStore(
            url, "in-memory and URI databases are not supported; use memory:// or a file path"
        )
    if "\x00" in path:
        raise UnsupportedStore(url, "the path contains a NUL character")
    return path


def _check_directory(url: str, path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UnsupportedStore(
            url, f"directory {directory} does not exist; create it first (wakeful will not)"
        )


async def open_sqlite_store(url: str, *, clock: Clock | None = None, **options: Any) -> SqliteStore:
    """Open (creating or migrating it if needed) the SQLite store at ``url``."""
    path = parse_url(url)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        known = "; ".join(f"{k}: {v}" for k, v in OPTIONS.items())
        raise UnsupportedStore(url, f"unknown options {unknown}; sqlite:// takes {known}")
    busy_timeout = check_seconds("busy_timeout", options.get("busy_timeout", 5.0))
    readers = check_count("readers", options.get("readers", 4), minimum=1, maximum=64)
    poll_interval = check_seconds("poll_interval", options.get("poll_interval", 0.025))
    _check_directory(url, path)
    clock = clock or SystemClock()
    db = await Database.open(
        path,
        url,
        busy_timeout=busy_timeout,
        readers=readers,
        migrations=shipped(),
        now_us=lambda: to_us(clock.now()),
    )
    return SqliteStore(db, clock, poll_interval)


__all__ = ["SqliteStore", "SqliteStreamCheckpoints", "open_sqlite_store", "parse_url"]
