"""``TickStore`` on PostgreSQL (``wakeful.store.firings``): a batch of firings is one call of
the schema's ``fire_schedules`` function (migration 0019), one statement and one round trip
however many schedules and ticks it holds; the overlap check of a batch is one read."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec

from wakeful.store import schedule_rows
from wakeful.store.firings import Fired, Firing, check_dispatch_ids, check_firings
from wakeful.store.postgres import codec
from wakeful.store.postgres.codec import DISPATCH_COLUMNS
from wakeful.store.postgres.connection import Database, utc

_DISPATCH = ", ".join(f"(o_dispatch).{c.strip()}" for c in DISPATCH_COLUMNS.split(","))
_FIRE = f"SELECT o_lost, o_refused, {_DISPATCH} FROM @schema@.fire_schedules(%s, %s)"
_JSON = msgspec.json.Encoder()
_UNFINISHED = "SELECT * FROM @schema@.unfinished_runs(%s::text[])"
_NEXT_DUE = (
    "SELECT @schema@.store_now(), "
    "(SELECT min(next_fire_at) FROM @schema@.schedules WHERE NOT paused)"
)


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

    async def next_schedule_due(self) -> tuple[datetime, datetime | None]:
        row = await self._db.fetchone(_NEXT_DUE, None, idempotent=True)
        return utc(row[0]), None if row[1] is None else utc(row[1])


__all__ = ["FiringOps"]
