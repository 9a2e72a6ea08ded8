"""PostgreSQL test support: a migrated template database per session, a fresh clone of it per
test, and the hooks that make a server-clock store testable.

Every Postgres test runs in its own database ``wakeful_t_<uuid>``, created from the template
``wakeful_tpl_<pid>`` (migrated once) and dropped after the test, its leftover connections
terminated first. Everything connects as the ``postgres`` role.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from tests.services import postgres_dsn
from wakeful.store.postgres import PostgresStore, open_postgres_store

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "wakeful"
TABLE_TIMES = {
    "threads": ("claim_expires", "updated_at"),
    "dispatches": ("available_at", "lease_until", "lease_expires", "created_at", "updated_at"),
    "checkpoints": ("at",),
    "events": ("at",),
    "receipts": ("at",),
    "inbox": ("at",),
    "outbox": ("at",),
    "workers": ("registered_at", "last_heartbeat"),
    "stream_checkpoints": ("updated_at",),
    "schedules": ("next_fire_at", "created_at", "updated_at"),
    "limit_buckets": ("stamp", "blocked"),
    "limit_waits": ("since", "until"),
}
"""Every stored time, per table: what ``advance_store_clock`` moves back."""


def dsn_for(dbname: str) -> str:
    return postgres_dsn(dbname)


@dataclass
class Databases:
    """The session's template and the databases cloned from it."""

    template: str
    created: list[str] = field(default_factory=list)

    async def clone(self) -> str:
        """Create a fresh database from the template and return its DSN."""
        name = f"wakeful_t_{uuid.uuid4().hex[:20]}"
        async with await psycopg.AsyncConnection.connect(
            dsn_for("postgres"), autocommit=True
        ) as admin:
            await admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
        self.created.append(name)
        return dsn_for(name)

    def drop_created(self) -> None:
        names, self.created = self.created, []
        drop_database(*names)


def drop_database(*names: str) -> None:
    """Drop the databases, terminating whatever still connects to them first."""
    if not names:
        return
    with psycopg.connect(dsn_for("postgres"), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
            (list(names),),
        )
        for name in names:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def open_test_store(dsn: str, **options: object) -> PostgresStore:
    """A store with a small pool, as tests open many."""
    settings: dict[str, object] = {"pool_size": 4, "pool_min_size": 1, "pool_timeout": 5.0}
    settings.update(options)
    return await open_postgres_store(dsn, **settings)  # type: ignore[arg-type]


async def freeze_clock(dsn: str, schema: str = SCHEMA) -> None:
    """Stop the store's clock in this (test) database: ``store_now()`` returns one fixed
    instant from a table. A real server clock runs between two calls, which makes the
    contract's exact boundaries (live at ``expires_at``, expired a microsecond later)
    untestable; frozen, "moving every stored time back" is exactly "the clock moved"."""
    ident = sql.Identifier(schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {s}.test_clock (at timestamptz NOT NULL);"
                "INSERT INTO {s}.test_clock VALUES (now());"
                "CREATE OR REPLACE FUNCTION {s}.store_now() RETURNS timestamptz"
                " LANGUAGE sql STABLE AS $$ SELECT at FROM {s}.test_clock $$"
            ).format(s=ident)
        )


async def reset_database(dsn: str, schema: str = SCHEMA) -> None:
    """Empty every table of the store (a fresh store, tokens from 1 again) and restart the
    frozen clock at the server's now, for tests that need many fresh stores in a row.
    (``DELETE``, not ``TRUNCATE``: the tables are tiny and truncation costs file syncs.)"""
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        conn.transaction(),
    ):
        for table in (*TABLE_TIMES, "messages", "writes"):
            await conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, table)))
        await conn.execute(
            sql.SQL("UPDATE {}.test_clock SET at = now()").format(sql.Identifier(schema))
        )


async def move_stored_times_back(dsn: str, seconds: float, schema: str = SCHEMA) -> None:
    """Make ``seconds`` pass for the store: every stored expiry, availability and timestamp
    moves back by that much, in one transaction."""
    ident = sql.Identifier(schema)
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        conn.transaction(),
    ):
        for table, columns in TABLE_TIMES.items():
            moves = sql.SQL(", ").join(
                sql.SQL("{c} = {c} - make_interval(secs => %(s)s)").format(c=sql.Identifier(c))
                for c in columns
            )
            await conn.execute(
                sql.SQL("UPDATE {}.{} SET {}").format(ident, sql.Identifier(table), moves),
                {"s": seconds},
            )


async def move_frozen_clock(dsn: str, seconds: float, schema: str = SCHEMA) -> None:
    """Move the frozen store clock (``freeze_clock``) forward by ``seconds``."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {}.test_clock SET at = at + make_interval(secs => %s)").format(
                sql.Identifier(schema)
            ),
            (seconds,),
        )


def postgres_cluster() -> tuple[str, str]:
    """The (version, name) of the local cluster, from /etc/postgresql."""
    versions = sorted(os.listdir("/etc/postgresql"), key=lambda v: float(v))
    version = versions[-1]
    names = sorted(os.listdir(f"/etc/postgresql/{version}"))
    return version, "main" if "main" in names else names[0]


def server_answers(timeout: float = 1.0) -> bool:
    try:
        with psycopg.connect(dsn_for("postgres"), connect_timeout=max(1, int(timeout))) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def ensure_server_up(deadline_seconds: float = 60.0) -> None:
    """Poll until PostgreSQL answers; start the cluster if it is down. Raises if it does not
    come back within the deadline."""
    deadline = time.monotonic() + deadline_seconds
    started = False
    while time.monotonic() < deadline:
        if server_answers():
            return
        if not started:
            version, name = postgres_cluster()
            subprocess.run(
                ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start"],
                check=False,
                capture_output=True,
                timeout=60,
            )
            started = True
        time.sleep(0.2)
    raise RuntimeError("PostgreSQL did not come back within the deadline")
