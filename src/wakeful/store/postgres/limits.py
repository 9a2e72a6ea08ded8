"""Rate-limit buckets on PostgreSQL (``RateLimitStore``): one row per key, each change one
statement judged by the server's clock (``take_limit()`` of migration 0016 locks the row and
writes it back in the same call; since migration 0019 it also pays the process's pending
reconciles first and records the run a refused take is for). Takes and reconciles commit
without waiting for the WAL flush (soft state on a hot row: see the migration); a block waits
for it."""

from __future__ import annotations

from datetime import datetime

from wakeful import limits
from wakeful.ids import check_id
from wakeful.limits import BucketState, LimitBucket, LimitWaiter, RateLimit
from wakeful.store.buckets import Wait, check_take_call, listed, seconds
from wakeful.store.postgres.connection import Database, utc

_TAKE = "SELECT @schema@.take_limit(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
_RECONCILE = "SELECT @schema@.reconcile_limit(%s, %s)"
# A block drains the bucket (a debt stays) and never moves an existing block earlier.
_BLOCK = """
INSERT INTO @schema@.limit_buckets AS b (key, burst, requests, tokens, stamp, blocked)
SELECT %(key)s, 1, 0, 0, n, n + make_interval(secs => %(secs)s)
  FROM (SELECT @schema@.store_now() AS n) k
ON CONFLICT (key) DO UPDATE
   SET requests = least(0, b.requests), tokens = least(0, b.tokens), stamp = excluded.stamp,
       blocked = greatest(excluded.blocked, b.blocked)
"""
_LIST = """
SELECT key, rpm, tpm, burst, requests, tokens, stamp, blocked, @schema@.store_now()
  FROM @schema@.limit_buckets ORDER BY key
"""
_WAITS = "SELECT key, run_id, thread_id, since, until FROM @schema@.limit_waits"


class LimitOps:
    """Mixin of ``PostgresStore``."""

    _db: Database

    async def take_limit(
        self,
        limit: RateLimit,
        requests: int,
        tokens: int,
        settle: int = 0,
        waiter: LimitWaiter | None = None,
    ) -> float:
        check_take_call(limit, requests, tokens, settle, waiter)
        params = (
            limit.key,
            limit.requests_per_minute,
            limit.tokens_per_minute,
            limit.burst_seconds,
            requests,
            tokens,
            settle,
            None if waiter is None else waiter.run_id,
            None if waiter is None else waiter.thread_id,
        )
        (wait,) = await self._db.fetchone(_TAKE, params)
        return float(wait)

    async def reconcile_limit(self, key: str, tokens: int) -> None:
        check_id("limit key", key)
        await self._db.execute(_RECONCILE, (key, limits.check_delta(tokens)))

    async def block_limit(self, key: str, seconds: float) -> None:
        check_id("limit key", key)
        await self._db.execute(_BLOCK, {"key": key, "secs": limits.check_wait(seconds)})

    async def limit_buckets(self) -> list[LimitBucket]:
        rows = await self._db.fetchall(_LIST, None, idempotent=True)
        waits: dict[str, list[Wait]] = {}
        if rows:
            for key, run_id, thread_id, since, until in await self._db.fetchall(
                _WAITS, None, idempotent=True
            ):
                waits.setdefault(key, []).append(Wait(run_id, thread_id, _at(since), _at(until)))
        found = []
        for key, rpm, tpm, burst, requests, tokens, stamp, blocked, now in rows:
            state = BucketState(
                rpm,
                tpm,
                burst,
                requests,
                tokens,
                _at(stamp),
                0.0 if blocked is None else _at(blocked),
            )
            found.append(listed(key, state, _at(now), waits.get(key)))
        return found


def _at(value: datetime) -> float:
    return seconds(utc(value))
