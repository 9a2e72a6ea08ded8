"""Versioned schema migrations, shipped as SQL files in ``wakeful/store/sql/sqlite``.

File ``NNNN_name.sql`` is schema version ``NNNN``. The table ``wakeful_schema`` records each
applied version. ``migrate`` applies every missing version in one ``BEGIN IMMEDIATE``
transaction (SQLite's DDL is transactional), so a database is either fully at the new
version or untouched, and concurrent openers (other processes) serialise on the write lock:
the first one migrates, the others find nothing to do.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from importlib import resources

from wakeful.errors import UnsupportedStore

SCHEMA_TABLE = "wakeful_schema"
_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def shipped() -> list[Migration]:
    """The migrations in the package, in version order."""
    folder = resources.files("wakeful.store").joinpath("sql", "sqlite")
    found = []
    for entry in folder.iterdir():
        match = _FILE.fullmatch(entry.name)
        if match is not None:
            found.append(
                Migration(int(match[1]), f"{match[1]}_{match[2]}", entry.read_text("utf-8"))
            )
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"wakeful's SQLite migrations are not numbered 1..n: {found}")
    return found


def statements(sql: str) -> list[str]:
    """Split a script into complete statements (``executescript`` would commit first)."""
    out: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                out.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not _only_comments(buffer):
        raise ValueError(f"incomplete SQL statement at the end of a migration: {buffer[:80]!r}")
    return out


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())


def current_version(conn: sqlite3.Connection) -> int:
    """The schema version recorded in the database (0 for an empty database)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SCHEMA_TABLE,)
    ).fetchone()
    if exists is None:
        return 0
    row = conn.execute(f"SELECT max(version) FROM {SCHEMA_TABLE}").fetchone()
    return int(row[0] or 0)


def migrate(
    conn: sqlite3.Connection, url: str, migrations: list[Migration], now_us: int
) -> list[int]:
    """Bring the database to the latest of ``migrations`` in one transaction; returns the
    versions applied (empty when it was current). Refuses a database written by a newer
    wakeful, and a database that already holds tables but is not a wakeful store."""
    latest = migrations[-1].version if migrations else 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = current_version(conn)
        if version == 0:
            foreign = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' LIMIT 3"
            ).fetchall()
            if foreign:
                raise UnsupportedStore(
                    url,
                    f"the file holds tables ({', '.join(r[0] for r in foreign)}) but is not a "
                    f"wakeful store; point the URL at a new file or an existing wakeful database",
                )
        if version > latest:
            raise UnsupportedStore(
                url,
                f"the database is at schema version {version}, newer than this wakeful knows "
                f"({latest}); it was written by a newer wakeful. Upgrade wakeful in this "
                f"environment (every process sharing the file must run a version that knows "
                f"schema {version}); nothing was changed",
            )
        applied = []
        if version == 0:
            conn.execute(
                f"CREATE TABLE {SCHEMA_TABLE} (version INTEGER PRIMARY KEY, "
                f"name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
            )
        for migration in migrations:
            if migration.version <= version:
                continue
            for statement in statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO {SCHEMA_TABLE} (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, now_us),
            )
            applied.append(migration.version)
        conn.execute("COMMIT")
        return applied
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
