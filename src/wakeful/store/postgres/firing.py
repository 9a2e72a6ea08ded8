"""``TickStore`` and ``AheadStore`` on PostgreSQL (``wakeful.store.firings``): a batch of
firings is one call of the schema's ``fire_schedules`` function (migration 0020), one
statement and one round trip however many schedules and ticks it holds; the overlap check of
a batch is one read. Ticks prepared ahead are stored with their schedules (one statement per
page) and fired by ``fire_prepared`` (migration 0025, decision 0055): the due schedules and
their ticks in a few set-based statements, with no per-tick work in Python."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec

from wakeful.errors import InvalidInput
from wakeful.ids import check_count
from wakeful.records import Schedule
from wakeful.store import schedule_rows
from wakeful.store.firings import (
    MAX_FIRINGS,
    Fired,
    FiredAhead,
    Firing,
    Prepared,
    check_dispatch_ids,
    check_firings,
    check_prepared,
)
from wakeful.store.postgres import codec
from wakeful.store.postgres.codec import DISPATCH_COLUMNS
from wakeful.store.postgres.connection import Database, utc
from wakeful.store.postgres.schedules import row_of

_DISPATCH = ", ".join(f"(o_dispatch).{c.strip()}" for c in DISPATCH_COLUMNS.split(","))
_FIRE = f"SELECT o_lost, o_refused, {_DISPATCH} FROM @schema@.fire_schedules(%s, %s)"
_JSON = msgspec.json.Encoder()
_UNFINISHED = "SELECT * FROM @schema@.unfinished_runs(%s::text[])"
_NEXT_DUE = (
    "SELECT @schema@.store_now(), "
    "(SELECT min(next_fire_at) FROM @schema@.schedules WHERE NOT paused)"
)

_TO_PREPARE = """
WITH k AS MATERIALIZED (SELECT @schema@.store_now() AS n)
SELECT k.n, s.paused, s.next_fire_at, s.revision, s.created_at, s.updated_at, s.body
  FROM k LEFT JOIN LATERAL (
       SELECT * FROM @schema@.schedules
        WHERE NOT paused AND prepared_revision IS DISTINCT FROM revision
          AND next_fire_at <= k.n + make_interval(secs => %s)
        ORDER BY next_fire_at, md5(name || %s) LIMIT %s) s ON true
"""
# each schedule only at the revision it was prepared at, and passed over while a firer holds
# it (it is being fired: its revision changes)
_PREPARE = """
WITH v AS (
    SELECT * FROM jsonb_to_recordset(%s::jsonb) AS x(name text, revision bigint,
           tick timestamptz, until timestamptz, next timestamptz, prepared text, body text)
), l AS (
    SELECT s.name FROM @schema@.schedules s
      JOIN v ON s.name = v.name AND s.revision = v.revision
     ORDER BY s.name
       FOR UPDATE OF s SKIP LOCKED
)
UPDATE @schema@.schedules s
   SET prepared_revision = v.revision, prepared_tick = v.tick, prepared_until = v.until,
       prepared_next = v.next, prepared = v.prepared, prepared_body = v.body
  FROM v JOIN l ON l.name = v.name
 WHERE s.name = v.name
"""
# due, and not what fire_prepared() takes (a valid preparation, the clock before its end)
_DUE_UNPREPARED = """
WITH k AS MATERIALIZED (SELECT @schema@.store_now() AS n)
SELECT k.n, s.paused, s.next_fire_at, s.revision, s.created_at, s.updated_at, s.body
  FROM k LEFT JOIN LATERAL (
       SELECT * FROM @schema@.schedules
        WHERE NOT paused AND next_fire_at <= k.n
          AND NOT coalesce(prepared_revision = revision AND prepared_tick = next_fire_at
                           AND k.n < coalesce(prepared_until, 'infinity'), false)
        ORDER BY next_fire_at, name LIMIT %s) s ON true
"""
_FIRE_PREPARED = f"SELECT o_name, o_state, {_DISPATCH} FROM @schema@.fire_prepared(%s)"
# what the firing loop reads: the dispatch ids only (it counts them)
_COUNT_PREPARED = "SELECT o_name, o_state, (o_dispatch).dispatch_id FROM @schema@.fire_prepared(%s)"


def _prepared_row(p: Prepared) -> dict[str, object]:
    if p.tick is None or p.firing is None:
        return {"name": p.name, "revision": p.revision}
    s = p.firing.schedule
    tick = p.firing.dispatches[0] if p.firing.dispatches else None
    return {
        "name": p.name,
        "revision": p.revision,
        "tick": p.tick,
        "until": p.until,
        "next": s.next_fire_at,
        "body": schedule_rows.encode(s).decode(),
        "prepared": _JSON.encode(
            {
                "previous": p.previous,
                "overlap": s.overlap,
                "id": None if tick is None else tick.dispatch_id,
                "thread": None if tick is None else tick.thread_id,
                "payload": None if tick is None else codec.text(tick.payload),
                "tenant": None if tick is None else tick.tenant,
                "priority": 0 if tick is None else tick.priority,
                "max_attempts": 0 if tick is None else tick.max_attempts,
                "waiting": None if p.waiting is None else schedule_rows.encode(p.waiting).decode(),
            }
        ).decode(),
    }


class FiringOps:
    """The batch-firing half of ``PostgresStore``."""

    _db: Database

    async def fire_schedules(self, firings: Sequence[Firing]) -> Fired:
        batch = check_firings(firings)
        if not batch:
            return Fired()
        schedules = [
            {
                "i": i,
                "name": f.schedule.name,
                "revision": f.expected_revision,
                "tenant": f.schedule.tenant,
                "paused": f.schedule.paused,
                "next_fire_at": f.schedule.next_fire_at,
                "body": schedule_rows.encode(f.schedule).decode(),
            }
            for i, f in enumerate(batch, start=1)
        ]
        owned = [(i, d) for i, f in enumerate(batch, start=1) for d in f.dispatches]
        # by thread (stable: a schedule's ticks on one thread stay oldest first), the order
        # every firer takes thread locks in
        owned.sort(key=lambda t: t[1].thread_id)
        ticks = [
            {
                "i": k,
                "owner": i,
                "id": d.dispatch_id,
                "thread": d.thread_id,
                "payload": codec.text(d.payload),
                "tenant": d.tenant,
                "priority": d.priority,
                "max_attempts": d.max_attempts,
            }
            for k, (i, d) in enumerate(owned, start=1)
        ]
        params = (_JSON.encode(schedules).decode(), _JSON.encode(ticks).decode())
        rows = await self._db.fetchall(_FIRE, params)
        fired = Fired()
        for lost, refused, *dispatch in rows:
            if lost is not None:
                fired.lost.append(lost)
            elif refused is not None:
                fired.refused.append(refused)
            elif dispatch[0] is not None:
                fired.created.append(codec.dispatch(tuple(dispatch)))
        return fired

    async def unfinished_runs(self, dispatch_ids: Sequence[str]) -> set[str]:
        ids = check_dispatch_ids(dispatch_ids)
        if not ids:
            return set()
        rows = await self._db.fetchall(_UNFINISHED, (ids,), idempotent=True)
        return {r[0] for r in rows}

    async def to_prepare(
        self, ahead: float, limit: int, salt: str = ""
    ) -> tuple[datetime, list[Schedule]]:
        limit = check_count("limit", limit, minimum=1)
        if not isinstance(ahead, int | float) or not 0 <= ahead <= 86_400:
            raise InvalidInput("ahead", "must be between 0 and 86400 seconds")
        if not isinstance(salt, str) or len(salt) > 64:
            raise InvalidInput("salt", "must be a string of at most 64 characters")
        rows = await self._db.fetchall(_TO_PREPARE, (float(ahead), salt, limit), idempotent=True)
        now = utc(rows[0][0])
        return now, [row_of(r[1:]) for r in rows if r[6] is not None]

    async def prepare_ticks(self, prepared: Sequence[Prepared]) -> int:
        batch = check_prepared(prepared)
        if not batch:
            return 0
        text = _JSON.encode([_prepared_row(p) for p in batch]).decode()
        return await self._db.execute(_PREPARE, (text,))

    async def due_unprepared(self, limit: int = 100) -> tuple[datetime, list[Schedule]]:
        limit = check_count("limit", limit, minimum=1)
        rows = await self._db.fetchall(_DUE_UNPREPARED, (limit,), idempotent=True)
        now = utc(rows[0][0])
        return now, [row_of(r[1:]) for r in rows if r[6] is not None]

    async def fire_prepared(self, limit: int, *, collect: bool = True) -> FiredAhead:
        limit = check_count("limit", limit, minimum=1, maximum=MAX_FIRINGS)
        rows = await self._db.fetchall(_FIRE_PREPARED if collect else _COUNT_PREPARED, (limit,))
        fired = FiredAhead()
        taken = waiting = count = 0
        for name, state, *dispatch in rows:
            if state == "waiting":
                waiting += 1
                taken += 1
            elif state == "refused":
                fired.refused.append(name)
            elif state is not None:
                taken += 1
            elif dispatch[0] is not None:
                count += 1
                if collect:
                    fired.created.append(codec.dispatch(tuple(dispatch)))
        return msgspec.structs.replace(fired, taken=taken, waiting=waiting, fired=count)

    async def next_schedule_due(self) -> tuple[datetime, datetime | None]:
        row = await self._db.fetchone(_NEXT_DUE, None, idempotent=True)
        return utc(row[0]), None if row[1] is None else utc(row[1])


__all__ = ["FiringOps"]
