"""``ScheduleStore`` on SQLite: a schedule's compare-and-set is one write transaction (the
current revision read and the row written under the database's write lock)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from wakeful.ids import check_count, check_optional_id
from wakeful.records import Schedule
from wakeful.store import schedule_rows
from wakeful.store.sqlite.codec import from_us, from_us_opt, to_us

T = TypeVar("T")

_COLUMNS = "paused, next_fire_at, revision, created_at, updated_at, body"


def _row(row: Any) -> Schedule:
    paused, next_fire_at, revision, created_at, updated_at, body = row
    return schedule_rows.decode(
        body,
        paused=bool(paused),
        next_fire_at=from_us_opt(next_fire_at),
        revision=revision,
        created_at=from_us(created_at),
        updated_at=from_us(updated_at),
    )


def _get(conn: sqlite3.Connection, name: str) -> Schedule | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (name,)).fetchone()
    return None if row is None else _row(row)


def put_row(
    conn: sqlite3.Connection, now: datetime, new: Schedule, expected: int | None
) -> Schedule | None:
    stored = schedule_rows.replaced(_get(conn, new.name), new, expected, now)
    if stored is None:
        return None
    assert stored.created_at is not None and stored.updated_at is not None
    conn.execute(
        "INSERT OR REPLACE INTO schedules (name, tenant, paused, next_fire_at, revision, "
        "created_at, updated_at, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            stored.name,
            stored.tenant,
            int(stored.paused),
            None if stored.next_fire_at is None else to_us(stored.next_fire_at),
            stored.revision,
            to_us(stored.created_at),
            to_us(stored.updated_at),
            schedule_rows.encode(stored).decode(),
        ),
    )
    return stored


def revision_of(conn: sqlite3.Connection, name: str) -> int | None:
    """The stored revision of the schedule ``name`` (``None``: there is none)."""
    row = conn.execute("SELECT revision FROM schedules WHERE name = ?", (name,)).fetchone()
    return None if row is None else int(row[0])


class SqliteSchedules:
    """The schedules half of ``SqliteStore`` (which provides ``_write``, ``_read``, ``now``)."""

    async def _write(self, job: Callable[[sqlite3.Connection, datetime], T]) -> T:
        raise NotImplementedError

    async def _read(self, job: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    def now(self) -> datetime:
        raise NotImplementedError

    async def store_now(self) -> datetime:
        return self.now()

    async def put_schedule(
        self, schedule: Schedule, expected_revision: int | None = None
    ) -> Schedule | None:
        new = schedule_rows.check_schedule(schedule)
        expected = schedule_rows.check_expected(expected_revision)
        return await self._write(lambda c, now: put_row(c, now, new, expected))

    async def get_schedule(self, name: str) -> Schedule | None:
        schedule_rows.check_name(name)
        return await self._read(lambda c: _get(c, name))

    async def list_schedules(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Schedule]:
        check_optional_id("tenant", tenant)
        check_optional_id("after", after)
        limit = check_count("limit", limit, minimum=1)
        where, params = ["name > ?"], [after or ""]
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
        sql = (
            f"SELECT {_COLUMNS} FROM schedules WHERE {' AND '.join(where)} "
            f"ORDER BY name LIMIT {limit}"
        )
        return await self._read(lambda c: [_row(r) for r in c.execute(sql, params)])

    async def delete_schedule(self, name: str) -> bool:
        schedule_rows.check_name(name)
        return await self._write(
            lambda c, _: c.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount > 0
        )

    async def due_schedules(self, limit: int = 100) -> tuple[datetime, list[Schedule]]:
        limit = check_count("limit", limit, minimum=1)
        sql = (
            f"SELECT {_COLUMNS} FROM schedules WHERE paused = 0 AND next_fire_at <= ? "
            f"ORDER BY next_fire_at, name LIMIT {limit}"
        )

        now = self.now()
        return now, await self._read(lambda c: [_row(r) for r in c.execute(sql, (to_us(now),))])


__all__ = ["SqliteSchedules", "put_row", "revision_of"]
