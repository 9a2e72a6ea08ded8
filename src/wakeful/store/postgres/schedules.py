"""``ScheduleStore`` on PostgreSQL. Each write is one statement (a compare-and-set is an
``UPDATE ... WHERE revision = $expected`` or an ``INSERT ... ON CONFLICT DO NOTHING``), so
no lock is held across a round trip; times are the server's ``store_now()``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from wakeful.ids import check_count, check_optional_id
from wakeful.records import Schedule
from wakeful.store import schedule_rows
from wakeful.store.postgres.connection import Database, utc

_RETURNING = "RETURNING paused, next_fire_at, revision, created_at, updated_at, body"
_COLUMNS = "paused, next_fire_at, revision, created_at, updated_at, body"
_INSERT = """
INSERT INTO @schema@.schedules AS s
       (name, tenant, paused, next_fire_at, revision, created_at, updated_at, body)
VALUES (%s, %s, %s, %s, 1, @schema@.store_now(), @schema@.store_now(), %s)
"""
_UPSERT = (
    _INSERT
    + """ON CONFLICT (name) DO UPDATE
   SET tenant = EXCLUDED.tenant, paused = EXCLUDED.paused,
       next_fire_at = EXCLUDED.next_fire_at, revision = s.revision + 1,
       updated_at = EXCLUDED.updated_at, body = EXCLUDED.body
"""
    + _RETURNING
)
_CREATE = _INSERT + "ON CONFLICT (name) DO NOTHING " + _RETURNING
_SWAP = (
    """
UPDATE @schema@.schedules
   SET tenant = %s, paused = %s, next_fire_at = %s, revision = revision + 1,
       updated_at = @schema@.store_now(), body = %s
 WHERE name = %s AND revision = %s
"""
    + _RETURNING
)
_GET = f"SELECT {_COLUMNS} FROM @schema@.schedules WHERE name = %s"
_DELETE = "DELETE FROM @schema@.schedules WHERE name = %s"
_DUE = f"""
WITH k AS MATERIALIZED (SELECT @schema@.store_now() AS n)
SELECT k.n, {_COLUMNS}
  FROM k LEFT JOIN LATERAL (
       SELECT * FROM @schema@.schedules
        WHERE NOT paused AND next_fire_at <= k.n
        ORDER BY next_fire_at, name LIMIT %s) s ON true
"""


def row_of(row: Any) -> Schedule:
    paused, next_fire_at, revision, created_at, updated_at, body = row
    return schedule_rows.decode(
        body,
        paused=paused,
        next_fire_at=None if next_fire_at is None else utc(next_fire_at),
        revision=revision,
        created_at=utc(created_at),
        updated_at=utc(updated_at),
    )


class ScheduleOps:
    """The schedules half of ``PostgresStore``."""

    _db: Database

    async def store_now(self) -> datetime:
        row = await self._db.fetchone("SELECT @schema@.store_now()", None, idempotent=True)
        return utc(row[0])

    async def put_schedule(
        self, schedule: Schedule, expected_revision: int | None = None
    ) -> Schedule | None:
        new = schedule_rows.check_schedule(schedule)
        expected = schedule_rows.check_expected(expected_revision)
        body = schedule_rows.encode(new).decode()
        if expected is None or expected == 0:
            template = _UPSERT if expected is None else _CREATE
            params: tuple[Any, ...] = (new.name, new.tenant, new.paused, new.next_fire_at, body)
        else:
            template = _SWAP
            params = (new.tenant, new.paused, new.next_fire_at, body, new.name, expected)
        row = await self._db.fetchone(template, params)
        return None if row is None else row_of(row)

    async def get_schedule(self, name: str) -> Schedule | None:
        schedule_rows.check_name(name)
        row = await self._db.fetchone(_GET, (name,), idempotent=True)
        return None if row is None else row_of(row)

    async def list_schedules(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Schedule]:
        check_optional_id("tenant", tenant)
        check_optional_id("after", after)
        limit = check_count("limit", limit, minimum=1)
        where, params = ["name > %s"], [after or ""]
        if tenant is not None:
            where.append("tenant = %s")
            params.append(tenant)
        sql = (
            f"SELECT {_COLUMNS} FROM @schema@.schedules WHERE {' AND '.join(where)} "
            f"ORDER BY name LIMIT {limit}"
        )
        rows = await self._db.fetchall(sql, tuple(params), idempotent=True)
        return [row_of(r) for r in rows]

    async def delete_schedule(self, name: str) -> bool:
        schedule_rows.check_name(name)
        return await self._db.execute(_DELETE, (name,)) > 0

    async def due_schedules(self, limit: int = 100) -> tuple[datetime, list[Schedule]]:
        limit = check_count("limit", limit, minimum=1)
        rows = await self._db.fetchall(_DUE, (limit,), idempotent=True)
        now = utc(rows[0][0])
        return now, [row_of(r[1:]) for r in rows if r[6] is not None]


__all__ = ["ScheduleOps", "row_of"]
