"""``TickStore`` on SQLite (``wakeful.store.firings``): a batch of firings is one write
transaction (one turn of the writer, one fsync) that checks each schedule's revision,
enqueues its ticks through the queue's own ``enqueue`` and stores the advanced schedule."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

import msgspec

from wakeful.errors import TenantMismatch
from wakeful.store.firings import Fired, Firing, check_dispatch_ids, check_firings
from wakeful.store.sqlite import queue
from wakeful.store.sqlite.codec import from_us_opt
from wakeful.store.sqlite.schedules import put_row, revision_of

T = TypeVar("T")

_TERMINAL = "('completed', 'failed', 'cancelled', 'indeterminate', 'interrupted')"
_UNFINISHED = f"""
SELECT d.dispatch_id FROM dispatches AS d
 WHERE d.dispatch_id IN (SELECT value FROM json_each(?))
   AND (d.status <> 'done' OR EXISTS (
        SELECT 1 FROM threads AS t
          JOIN checkpoints AS c ON c.thread_id = t.thread_id AND c.pos = t.latest_pos
         WHERE t.thread_id = d.thread_id
           AND json_extract(c.body, '$.run_id') = json_extract(d.payload, '$.run_id')
           AND json_extract(c.body, '$.status') NOT IN {_TERMINAL}))
"""
_NEXT_DUE = "SELECT min(next_fire_at) FROM schedules WHERE paused = 0"


def _fire(conn: sqlite3.Connection, now: datetime, batch: list[Firing]) -> Fired:
    fired = Fired()
    taken = []
    for f in sorted(batch, key=lambda f: f.schedule.name):
        if revision_of(conn, f.schedule.name) == f.expected_revision:
            taken.append(f)
        else:
            fired.lost.append(f.schedule.name)
    for f in taken:
        for d in f.dispatches:
            if queue.get(conn, d.dispatch_id) is not None:
                continue  # fired before, by a firer that died before storing the schedule
            try:
                fired.created.append(queue.enqueue(conn, now, d))
            except TenantMismatch:  # refused before it wrote anything
                fired.refused.append(d.dispatch_id)
        put_row(conn, now, f.schedule, f.expected_revision)
    return fired


class SqliteFiring:
    """The batch-firing half of ``SqliteStore`` (which provides ``_write`` and ``_read``)."""

    async def _write(self, job: Callable[[sqlite3.Connection, datetime], T]) -> T:
        raise NotImplementedError

    async def _read(self, job: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def fire_schedules(self, firings: Sequence[Firing]) -> Fired:
        batch = check_firings(firings)
        if not batch:
            return Fired()
        return await self._write(lambda c, now: _fire(c, now, batch))

    async def unfinished_runs(self, dispatch_ids: Sequence[str]) -> set[str]:
        ids = check_dispatch_ids(dispatch_ids)
        if not ids:
            return set()
        text = msgspec.json.encode(ids).decode()
        rows = await self._read(lambda c: c.execute(_UNFINISHED, (text,)).fetchall())
        return {r[0] for r in rows}

    def now(self) -> datetime:
        raise NotImplementedError

    async def next_schedule_due(self) -> tuple[datetime, datetime | None]:
        row = await self._read(lambda c: c.execute(_NEXT_DUE).fetchone())
        return self.now(), from_us_opt(row[0]) if row is not None else None


__all__ = ["SqliteFiring"]
