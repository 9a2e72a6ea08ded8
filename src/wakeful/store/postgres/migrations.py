"""Versioned schema migrations, shipped as SQL files in ``wakeful/store/sql/postgres``.

A file ``NNNN_name.sql`` is migration ``NNNN``. ``migrate`` applies the pending ones in order,
all in one transaction under ``pg_advisory_xact_lock`` (a key derived from the schema name),
so concurrent openers and CLI runs never race: the second waits, then finds nothing to do.
Each applied migration is recorded in ``<schema>.schema_migrations``. A database whose
schema is newer than this version of wakeful knows is refused, never downgraded.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from wakeful.errors import UnsupportedStore
from wakeful.store.postgres.connection import (
    DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
    DEFAULT_SCHEMA,
    bound_idle,
    check_schema,
    describe_server,
    render,
    server_reachable,
)
from wakeful.store.postgres.translate import connect_error, is_disconnect, unavailable

_FILE = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")


class SchemaVersionError(UnsupportedStore):
    """The database's wakeful schema is newer than this wakeful, or older and ``migrate``
    was turned off. Nothing was changed."""


@cache
def migrations() -> tuple[tuple[int, str, str], ...]:
    """``(version, file name, SQL)`` of every shipped migration, in order."""
    folder = resources.files("wakeful.store").joinpath("sql", "postgres")
    found = []
    for entry in folder.iterdir():
        match = _FILE.fullmatch(entry.name)
        if match is not None:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"wakeful's PostgreSQL migrations are not numbered 1..n: {versions}")
    return tuple(found)


def latest_version() -> int:
    return len(migrations())


def describe(dsn: str) -> str:
    """Where ``dsn`` points, without credentials, for messages."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "postgresql://<unparseable>"
    host = parts.get("host") or "localhost"
    return f"postgresql://{host}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"


def lock_key(schema: str) -> int:
    """The advisory lock key of ``schema``'s migrations (a signed 64-bit integer)."""
    digest = hashlib.sha256(f"wakeful.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def migrate(dsn: str, schema: str = DEFAULT_SCHEMA) -> int:
    """Bring ``schema`` in the database at ``dsn`` to the latest version and return it.

    Creates the schema if needed. Safe to run concurrently with other ``migrate`` calls and
    with stores opening. Raises ``SchemaVersionError`` if the database is newer than this
    wakeful, ``StoreUnavailable`` if the server cannot be reached."""
    schema = check_schema(schema)
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        reached = await server_reachable(dsn, 10.0)
        raise connect_error(exc, describe_server(dsn), reached) from None
    try:
        async with conn:
            return await apply(conn, schema, dsn)
    except psycopg.Error as exc:
        if is_disconnect(exc):
            raise unavailable(exc) from exc
        raise


async def apply(
    conn: psycopg.AsyncConnection[TupleRow],
    schema: str,
    dsn: str,
    idle_timeout: float = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
) -> int:
    """Apply the pending migrations in one transaction of many round trips, which holds the
    migration lock and the altered tables' locks (every store call on them waits): bounded
    by ``bound_idle``, so a migrating process paused or cut off between two statements
    releases them after ``idle_timeout`` seconds instead of blocking the store for as long as
    the pause lasts."""
    ident = sql.Identifier(schema)
    async with conn.transaction():
        await bound_idle(conn, idle_timeout)
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema),))
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_migrations ("
                " version integer PRIMARY KEY,"
                " name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        current = await _recorded(conn, schema)
        _refuse_newer(current, schema, dsn)
        for version, name, text in migrations():
            if version <= current:
                continue
            await conn.execute(render(text, conn, schema))
            await conn.execute(
                sql.SQL("INSERT INTO {}.schema_migrations (version, name) VALUES (%s, %s)").format(
                    ident
                ),
                (version, name),
            )
    return latest_version()


async def check(conn: psycopg.AsyncConnection[TupleRow], schema: str, dsn: str) -> int:
    """Refuse to use a schema that is not exactly at the latest version (without changing
    anything); returns the version."""
    current = await _recorded(conn, schema)
    _refuse_newer(current, schema, dsn)
    if current < latest_version():
        raise SchemaVersionError(
            describe(dsn),
            f"schema {schema!r} is at version {current} but this wakeful needs version "
            f"{latest_version()}; run wakeful.store.postgres.migrate() or open the store with "
            f"migrate=True",
        )
    return current


async def _recorded(conn: psycopg.AsyncConnection[TupleRow], schema: str) -> int:
    cur = await conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL",
        (sql.Identifier(schema, "schema_migrations").as_string(conn),),
    )
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute(
        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_migrations").format(
            sql.Identifier(schema)
        )
    )
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


def _refuse_newer(current: int, schema: str, dsn: str) -> None:
    if current > latest_version():
        raise SchemaVersionError(
            describe(dsn),
            f"schema {schema!r} is at version {current}, newer than the version "
            f"{latest_version()} this wakeful knows; upgrade wakeful (a database is never "
            f"migrated down)",
        )


__all__ = ["SchemaVersionError", "latest_version", "migrate", "migrations"]
