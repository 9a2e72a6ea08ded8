"""Rate-limit buckets on SQLite (``RateLimitStore``): each call is one write transaction
that reads the key's row and writes it back with ``wakeful.limits``' arithmetic, at the
store's clock read inside the transaction. A take's waiter is a row of ``limit_waits``
(migration 0012), written in the same transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from wakeful import limits
from wakeful.concurrency import KeyUse
from wakeful.ids import check_id
from wakeful.limits import BucketState, LimitBucket, LimitWaiter, RateLimit
from wakeful.store.buckets import Wait, check_take_call, listed, seconds, waited
from wakeful.store.sqlite.codec import to_us

T = TypeVar("T")
_COLUMNS = "rpm, tpm, burst, requests, tokens, stamp_us, blocked_us"
_WAITS = "run_id, thread_id, since_us, until_us"


def _state(row: tuple[float | None, float | None, float, float, float, int, int]) -> BucketState:
    rpm, tpm, burst, requests, tokens, stamp, blocked = row
    return BucketState(rpm, tpm, burst, requests, tokens, stamp / 1e6, blocked / 1e6)


def _wait(row: tuple[str, str, int, int]) -> Wait:
    return Wait(row[0], row[1], row[2] / 1e6, row[3] / 1e6)


def _load(conn: sqlite3.Connection, key: str) -> BucketState | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM limit_buckets WHERE key = ?", (key,)).fetchone()
    return None if row is None else _state(row)


def _save(conn: sqlite3.Connection, key: str, s: BucketState) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO limit_buckets (key, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (key, s.rpm, s.tpm, s.burst, s.requests, s.tokens, round(s.stamp * 1e6),
         round(s.blocked * 1e6)),
    )  # fmt: skip


def _waited(
    conn: sqlite3.Connection, key: str, waiter: LimitWaiter, wait: float, at: float
) -> None:
    """Record a refused take's waiter (and purge the key's long-gone ones) with the
    arithmetic of ``store.buckets.waited``."""
    rows = conn.execute(f"SELECT {_WAITS} FROM limit_waits WHERE key = ?", (key,))
    waits = {w.run_id: w for w in map(_wait, rows)}
    before = set(waits)
    waited(waits, waiter, wait, at)
    for run_id in before - set(waits):
        conn.execute("DELETE FROM limit_waits WHERE key = ? AND run_id = ?", (key, run_id))
    w = waits[waiter.run_id]
    conn.execute(
        f"INSERT OR REPLACE INTO limit_waits (key, {_WAITS}) VALUES (?, ?, ?, ?, ?)",
        (key, w.run_id, w.thread_id, round(w.since * 1e6), round(w.until * 1e6)),
    )


class SqliteLimits:
    """Mixin of ``SqliteStore``: the store's ``_write`` and ``_read`` jobs."""

    if TYPE_CHECKING:

        async def _write(self, job: Callable[[sqlite3.Connection, datetime], T]) -> T: ...

        async def _read(self, job: Callable[[sqlite3.Connection], T]) -> T: ...

        def now(self) -> datetime: ...

    async def take_limit(
        self,
        limit: RateLimit,
        requests: int,
        tokens: int,
        settle: int = 0,
        waiter: LimitWaiter | None = None,
    ) -> float:
        check_take_call(limit, requests, tokens, settle, waiter)

        def job(conn: sqlite3.Connection, now: datetime) -> float:
            at = to_us(now) / 1e6
            before = _load(conn, limit.key)
            state, wait = limits.settle_and_take(before, limit, requests, tokens, settle, at)
            _save(conn, limit.key, state)
            if waiter is not None and wait > 0:
                _waited(conn, limit.key, waiter, wait, at)
            elif waiter is not None:
                conn.execute(
                    "DELETE FROM limit_waits WHERE key = ? AND run_id = ?",
                    (limit.key, waiter.run_id),
                )
            return wait

        return await self._write(job)

    async def reconcile_limit(self, key: str, tokens: int) -> None:
        check_id("limit key", key)
        limits.check_delta(tokens)

        def job(conn: sqlite3.Connection, now: datetime) -> None:
            state = _load(conn, key)
            if state is not None:
                _save(conn, key, limits.reconcile(state, tokens))

        await self._write(job)

    async def block_limit(self, key: str, seconds: float) -> None:
        check_id("limit key", key)
        wait = limits.check_wait(seconds)

        def job(conn: sqlite3.Connection, now: datetime) -> None:
            _save(conn, key, limits.block(_load(conn, key), wait, to_us(now) / 1e6))

        await self._write(job)

    async def limit_buckets(self) -> list[LimitBucket]:
        def job(
            conn: sqlite3.Connection,
        ) -> tuple[list[tuple[str, BucketState]], list[tuple[str, Wait]]]:
            rows = conn.execute(f"SELECT key, {_COLUMNS} FROM limit_buckets ORDER BY key")
            found = [(row[0], _state(row[1:])) for row in rows]
            waits = conn.execute(f"SELECT key, {_WAITS} FROM limit_waits")
            return found, [(row[0], _wait(row[1:])) for row in waits]

        found, waits = await self._read(job)
        at = seconds(self.now())
        return [listed(key, state, at, [w for k, w in waits if k == key]) for key, state in found]

    async def concurrency_keys(self) -> list[KeyUse]:
        def job(conn: sqlite3.Connection) -> list[KeyUse]:
            rows = conn.execute(_KEY_USE).fetchall()
            return [KeyUse(key=k, limit=n, admitted=a, waiting=w) for k, n, a, w in rows]

        return await self._read(job)


# every key row, with its admitted and waiting rows counted over their indexes (a key with
# neither is left out)
_KEY_USE = (
    "SELECT key, lim, admitted, waiting FROM (SELECT k.key, k.lim, "
    "(SELECT count(*) FROM dispatches INDEXED BY dispatches_key_held "
    " WHERE concurrency_key = k.key AND status IN ('pending', 'leased')) AS admitted, "
    "(SELECT count(*) FROM dispatches INDEXED BY dispatches_key_waiting "
    " WHERE concurrency_key = k.key AND status = 'waiting_key') AS waiting "
    "FROM concurrency_keys AS k) WHERE admitted > 0 OR waiting > 0 ORDER BY key"
)
