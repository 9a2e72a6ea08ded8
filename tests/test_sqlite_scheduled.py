"""SQLite migration 13 (issue 38): delayed work stored ``pending`` by schema 12 becomes
``scheduled``, and a delayed run that held its thread's slot no longer does (the run queued
behind it is admitted)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from wakeful import ManualClock, open_store
from wakeful.store.sqlite import migrations
from wakeful.store.sqlite.codec import to_us

T0 = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)
_INSERT = (
    "INSERT INTO dispatches (dispatch_id, thread_id, kind, payload, priority, available_at, "
    "max_attempts, status, attempts, created_at, updated_at) "
    "VALUES (?, ?, 'start', '{}', 0, ?, 5, ?, ?, ?, ?)"
)


@pytest.mark.asyncio
async def test_migration_13_schedules_delayed_work(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    shipped = migrations.shipped()
    assert shipped[12].version == 13
    migrations.migrate(conn, "old", shipped[:12], to_us(T0))
    now, later = to_us(T0), to_us(T0 + timedelta(days=1))
    for row in (
        ("late", "t1", later, "pending", 0),  # a delayed run: held t1's slot at schema 11
        ("next", "t1", now, "queued", 0),
        ("busy", "t2", later, "pending", 1),  # a retry's backoff: keeps holding t2's slot
        ("wait", "t2", now, "queued", 0),
        ("ready", "t3", now, "pending", 0),
    ):
        conn.execute("INSERT INTO threads (thread_id) VALUES (?) ON CONFLICT DO NOTHING", row[1:2])
        conn.execute(_INSERT, (*row, now, now))
    conn.close()
    async with open_store(f"sqlite:///{path}", clock=ManualClock(T0)) as store:
        got = {d.dispatch_id: d.status for d in await store.list_dispatches()}
        assert got == {
            "late": "scheduled",
            "next": "pending",
            "busy": "scheduled",
            "wait": "queued",
            "ready": "pending",
        }
        leases = await store.claim_next("w", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in leases] == ["next", "ready"]
