"""``TickStore`` on PostgreSQL (``wakeful.store.firings``): a batch of firings is one call of
the schema's ``fire_schedules`` function (migration 0019), one statement and one round trip
however many schedules and ticks it holds; the overlap check of a batch is one read."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from wakeful.store import schedule_rows
from wakeful.store.firings import Fired, Firing, check_dispatch_ids, check_firings
from wakeful.store.postgres import codec
from wakeful.store.postgres.codec import DISPATCH_COLUMNS
from wakeful.store.postgres.connection import Database, utc

_DISPATCH = ", ".join(f"(o_dispatch).{c.strip()}" for c in DISPATCH_COLUMNS.split(","))
_FIRE = f"""
SELECT o_lost, o_refused, {_DISPATCH}
  FROM @schema@.fire_schedules(%s::text[], %s::bigint[], %s::text[], %s::boolean[],
                               %s::timestamptz[], %s::text[], %s::integer[], %s::text[],
                               %s::text[], %s::text[], %s::text[], %s::integer[], %s::bigint[])
"""
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
        columns: list[list[Any]] = [[] for _ in range(13)]
        for i, f in enumerate(batch, start=1):
            s = f.schedule
            for column, value in zip(
                columns[:6],
                (
                    s.name,
                    f.expected_revision,
                    s.tenant,
                    s.paused,
                    s.next_fire_at,
                    schedule_rows.encode(s).decode(),
                ),
                strict=True,
            ):
                column.append(value)
            for d in f.dispatches:
                ticks = (
                    i,
                    d.dispatch_id,
                    d.thread_id,
                    codec.text(d.payload),
                    d.tenant,
                    d.priority,
                    d.max_attempts,
                )
                for column, value in zip(columns[6:], ticks, strict=True):
                    column.append(value)
        rows = await self._db.fetchall(_FIRE, tuple(columns))
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
