"""Rate-limit buckets on SQLite (``RateLimitStore``): each call is one write transaction
that reads the key's row and writes it back with ``wakeful.limits``' arithmetic, at the
store's clock read inside the transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from wakeful import limits
from wakeful.concurrency import KeyUse
from wakeful.errors import InvalidInput
from wakeful.ids import check_id
from wakeful.limits import BucketState, LimitBucket, RateLimit
from wakeful.store.buckets import listed, seconds
from wakeful.store.sqlite.codec import to_us

T = TypeVar("T")
_COLUMNS = "rpm, tpm, burst, requests, tokens, stamp_us, blocked_us"


def _state(row: tuple[float | None, float | None, float, float, float, int, int]) -> BucketState:
    rpm, tpm, burst, requests, tokens, stamp, blocked = row
    return BucketState(rpm, tpm, burst, requests, tokens, stamp / 1e6, blocked / 1e6)


def _load(conn: sqlite3.Connection, key: str) -> BucketState | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM limit_buckets WHERE key = ?", (key,)).fetchone()
    return None if row is None else _state(row)


def _save(conn: sqlite3.Connection, key: str, s: BucketState) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO limit_buckets (key, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (key, s.rpm, s.tpm, s.burst, s.requests, s.tokens, round(s.stamp * 1e6),
         round(s.blocked * 1e6)),
    )  # fmt: skip


class SqliteLimits:
    """Mixin of ``SqliteStore``: the store's ``_write`` and ``_read`` jobs."""

    if TYPE_CHECKING:

        async def _write(self, job: Callable[[sqlite3.Connection, datetime], T]) -> T: ...

        async def _read(self, job: Callable[[sqlite3.Connection], T]) -> T: ...

        def now(self) -> datetime: ...

    async def take_limit(self, limit: RateLimit, requests: int, tokens: int) -> float:
        if not isinstance(limit, RateLimit):
            raise InvalidInput("limit", f"must be a RateLimit, got {type(limit).__name__}")
        limits.check_take(requests, tokens)

        def job(conn: sqlite3.Connection, now: datetime) -> float:
            at = to_us(now) / 1e6
            state, wait = limits.take(_load(conn, limit.key), limit, requests, tokens, at)
            _save(conn, limit.key, state)
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
        def job(conn: sqlite3.Connection) -> list[tuple[str, BucketState]]:
            rows = conn.execute(f"SELECT key, {_COLUMNS} FROM limit_buckets ORDER BY key")
            return [(row[0], _state(row[1:])) for row in rows]

        found = await self._read(job)
        at = seconds(self.now())
        return [listed(key, state, at) for key, state in found]

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
