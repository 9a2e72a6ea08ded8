"""A live channel over PostgreSQL ``NOTIFY`` (see ``wakeful.fleet.live``).

Publishers send every thread's events on one channel (``wakeful_live`` by default) from a
background task: everything published while the previous round trip ran goes in the next
one (``SELECT pg_notify(...) FROM unnest(...)``, one autocommit transaction with
``synchronous_commit`` off). The payload is the JSON array of one thread's events, so a
subscriber filters by the ``thread_id`` inside.

Presence, as the store's notifier does it (``wakeful.store.postgres.notify``): a listening
connection holds a shared advisory lock on the channel, and a round sends nothing when no
listener holds it (checked again after ``PRESENCE_RECHECK`` seconds). A subscriber opens one
listening connection on first use and reconnects when it is lost; whatever is sent in
between is lost, and the stream server fills such gaps from the stream checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from wakeful.fleet.live import Deliver, Subscribers, Unsubscribe, decode, encode
from wakeful.fleet.pgwake import check_channel
from wakeful.runtime.events import LiveEvent
from wakeful.store.postgres.notify import LISTENER_PRESENCE_SQL, PRESENCE_RECHECK

log = logging.getLogger("wakeful.fleet.pglive")

DEFAULT_CHANNEL = "wakeful_live"
CONNECT_TIMEOUT = 5
MAX_PENDING = 10_000
"""Payloads waiting to be sent at most; beyond it the oldest are dropped (the channel is a
hint, and a stalled server must not grow a worker's memory)."""
RECONNECT_DELAY = 0.5

SEND_SQL = """
WITH presence AS MATERIALIZED (
  SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
         NOT pg_try_advisory_xact_lock(hashtextextended(%(channel)s, 0)) AS listened)
SELECT listened,
       (SELECT count(pg_notify(%(channel)s, p)) FROM unnest(%(payloads)s::text[]) p
         WHERE listened)
  FROM presence
"""


class PostgresLive:
    """``PostgresLive(dsn, channel="wakeful_live")``: publish and subscribe."""

    def __init__(self, dsn: str, channel: str = DEFAULT_CHANNEL) -> None:
        self.dsn = dsn
        self.channel = check_channel(channel)
        self._subscribers = Subscribers()
        self._pending: list[str] = []
        self._wakeup = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._listened = True
        self._listened_at = 0.0
        self._closed = False
        self.sent = 0
        """Payloads sent (for tests and benchmarks)."""
        self.dropped = 0

    # ---------------------------------------------------------------- publish

    def publish(self, events: Sequence[LiveEvent]) -> None:
        if self._closed or not events:
            return
        if not self._listened and time.monotonic() - self._listened_at < PRESENCE_RECHECK:
            return  # nobody listens, recently enough to believe it
        self._pending.extend(p.decode() for p in encode(events))
        if len(self._pending) > MAX_PENDING:
            excess = len(self._pending) - MAX_PENDING
            del self._pending[:excess]
            self.dropped += excess
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_loop())
        self._wakeup.set()

    async def _send_loop(self) -> None:
        conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        try:
            while not self._closed:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._pending and not self._closed:
                    batch, self._pending = self._pending, []
                    started = time.monotonic()
                    try:
                        if conn is None or conn.closed:
                            conn = await psycopg.AsyncConnection.connect(
                                self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT
                            )
                        cur = await conn.execute(
                            SEND_SQL, {"channel": self.channel, "payloads": batch}
                        )
                        row = await cur.fetchone()
                    except (psycopg.Error, OSError) as exc:
                        self.dropped += len(batch)
                        log.warning(
                            "live channel %r: %d payload(s) dropped: %s",
                            self.channel,
                            len(batch),
                            exc,
                        )
                        await _close(conn)
                        conn = None
                        await asyncio.sleep(RECONNECT_DELAY)
                        continue
                    self._listened = bool(row[0]) if row is not None else True
                    self._listened_at = started
                    self.sent += len(batch) if self._listened else 0
        finally:
            await _close(conn)

    # ---------------------------------------------------------------- subscribe

    async def subscribe(self, thread_id: str, deliver: Deliver) -> Unsubscribe:
        self._subscribers.add(thread_id, deliver)
        if self._listener is None or self._listener.done():
            self._listening = asyncio.Event()
            self._listener = asyncio.get_running_loop().create_task(self._listen_loop())
        waiting = asyncio.ensure_future(self._listening.wait())
        await asyncio.wait(
            {waiting, self._listener}, timeout=CONNECT_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        waiting.cancel()

        async def unsubscribe() -> None:
            self._subscribers.remove(thread_id, deliver)

        return unsubscribe

    async def _listen_loop(self) -> None:
        while not self._closed:
            conn: psycopg.AsyncConnection[object] | None = None
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT
                )
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                await conn.execute(LISTENER_PRESENCE_SQL, (self.channel,))
                self._listening.set()
                while not self._closed:
                    async for note in conn.notifies(timeout=5.0):
                        events = decode(note.payload)
                        if events and events[0].thread_id in self._subscribers:
                            self._subscribers.deliver(events)
                    await conn.execute("SELECT 1")  # a silently dead connection shows here
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "live channel %r: listening connection lost (%s); reconnecting",
                    self.channel,
                    exc,
                )
                await asyncio.sleep(RECONNECT_DELAY)
            finally:
                self._listening.clear()
                await _close(conn)

    async def close(self) -> None:
        self._closed = True
        self._wakeup.set()
        for task in (self._sender, self._listener):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


async def _close(conn: psycopg.AsyncConnection[Any] | None) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            await conn.close()


__all__ = ["DEFAULT_CHANNEL", "PostgresLive"]
