"""Grouped claim renewals: the concurrent renewals of one store sent together, in one
statement and one transaction, each fenced and answered on its own.

A worker holding a thousand runs renews a thousand claims every ``renew_every`` seconds;
one statement each was the largest count of statements per run left (1.6 a run in the
N = 1,000 benchmark of issue 24), each costing the client 0.3-0.5 ms of CPU on the event
loop. As for commits (``group.py``): a renewal that finds nothing ahead of it goes out at
once, alone, as one call of the schema's ``renew()``; while a call is out, later renewals
queue, and everything queued (up to ``MAX_BATCH``) goes out as one statement when it
returns. No renewal waits for a timer.

The grouped statement does what ``renew()`` does for each row: lock the thread row, check
that the token is its current claim, move the claim's expiry and the lease's (the dispatch
granted with that claim). Rows are locked in thread id order, as every batch of this schema
locks them (``commit_many``), so batches cannot deadlock on each other. A row whose token is
not the current claim is answered ``StaleClaim`` (naming the current token), exactly as the
single call raises it; the other rows are renewed. A failure of the whole statement (a lost
connection) fails every renewal of the batch the way a single call would have failed.
"""

from __future__ import annotations

import asyncio

from wakeful.errors import StaleClaim
from wakeful.records import Claim
from wakeful.store.postgres.codec import Float8Array, Int8Array, TextArray
from wakeful.store.postgres.connection import Database, big, utc

MAX_BATCH = 500
"""Renewals per statement at most."""

RENEW = "SELECT o_holder, o_expires FROM @schema@.renew(%s, %s, %s)"
RENEW_MANY = """
WITH req AS (
    SELECT * FROM unnest(%b::text[], %b::int8[], %b::float8[])
      WITH ORDINALITY AS r(thread_id, token, ttl, n)
), held AS (
    SELECT t.thread_id, r.token, r.ttl, r.n
      FROM @schema@.threads t JOIN req r ON t.thread_id = r.thread_id AND t.claim_token = r.token
     ORDER BY t.thread_id
       FOR UPDATE OF t
), renewed AS (
    UPDATE @schema@.threads t
       SET claim_expires = @schema@.store_now() + make_interval(secs => h.ttl)
      FROM held h
     WHERE t.thread_id = h.thread_id AND t.claim_token = h.token
    RETURNING t.thread_id, t.claim_holder, t.claim_expires, h.token, h.n
), leases AS (
    UPDATE @schema@.dispatches d
       SET lease_until = r.claim_expires, lease_expires = r.claim_expires
      FROM renewed r
     WHERE d.thread_id = r.thread_id AND d.status = 'leased' AND d.token = r.token
)
SELECT q.n, r.claim_holder, r.claim_expires, t.claim_token
  FROM req q
  LEFT JOIN renewed r ON r.n = q.n
  LEFT JOIN @schema@.threads t ON r.n IS NULL AND t.thread_id = q.thread_id
 ORDER BY q.n
"""

_Key = tuple[str, int, float]


class GroupRenew:
    """The store's renewals, grouped while one is in flight (see the module)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._queue: dict[_Key, asyncio.Future[Claim]] = {}
        self._flight: asyncio.Task[None] | None = None
        self.batches = 0
        """Grouped statements sent (for tests and benchmarks)."""
        self.grouped = 0
        """Renewals sent in those statements."""

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        """The renewed claim, or its refusal raised (validated arguments)."""
        key = (thread_id, token, ttl)
        future = self._queue.get(key)  # the same renewal queued twice is sent once
        if future is None:
            future = self._queue[key] = asyncio.get_running_loop().create_future()
            self._launch()
        return await asyncio.shield(future)

    def _launch(self) -> None:
        if self._queue and (self._flight is None or self._flight.done()):
            batch = dict(list(self._queue.items())[:MAX_BATCH])
            for key in batch:
                del self._queue[key]
            self._flight = asyncio.get_running_loop().create_task(self._fly(batch))
            self._flight.add_done_callback(lambda _: self._launch())

    async def _fly(self, batch: dict[_Key, asyncio.Future[Claim]]) -> None:
        keys = list(batch)
        try:
            if len(keys) == 1:
                (thread_id, token, ttl) = keys[0]
                holder, expires = await self._db.fetchone(RENEW, (thread_id, big(token), ttl))
                rows = [(1, holder, expires, token)]
            else:
                params = (
                    TextArray([k[0] for k in keys]),
                    Int8Array([big(k[1]) for k in keys]),
                    Float8Array([k[2] for k in keys]),
                )
                rows = await self._db.fetchall(RENEW_MANY, params)
                self.batches += 1
                self.grouped += len(keys)
        except BaseException as exc:  # every renewal of the call fails the same way
            for future in batch.values():
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for key, (_, holder, expires, current) in zip(keys, rows, strict=True):
            future = batch[key]
            if future.done():
                continue
            thread_id, token, _ = key
            if holder is None or expires is None:  # not the thread's current claim
                future.set_exception(StaleClaim(thread_id, token, current))
            else:
                claim = Claim(
                    thread_id=thread_id, holder=holder, token=token, expires_at=utc(expires)
                )
                future.set_result(claim)

    async def close(self) -> None:
        """Wait for the call in flight (and the renewals queued behind it)."""
        while self._flight is not None and not self._flight.done():
            await asyncio.gather(self._flight, return_exceptions=True)
