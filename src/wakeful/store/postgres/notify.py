"""Sending the store's notifications after the write, never inside it.

A PostgreSQL transaction that ``NOTIFY``s takes a cluster-wide lock at commit and holds it
through its WAL flush, so committers that notify are serialised and lose group commit. The
store's writes therefore never notify: after a write returned, the store hands the thread id
to its ``Notifier`` and goes on. One background task per store drains the pending ids, all of
them per round trip, with one statement on a pooled connection::

    SELECT pg_notify(channel, t)
      FROM (SELECT set_config('synchronous_commit', 'off', true)) s, unnest(ids) t

``set_config(..., true)`` is ``SET LOCAL``: that transaction alone commits asynchronously, so
it neither waits for a WAL flush nor holds the notification lock through one.

A notification is a hint. A committer never waits for it; a failed round is logged and
dropped; a notification still pending when the process dies is lost. Waiters re-check by
sequence number at least every ``poll_interval`` seconds (see ``PostgresStore.wait_events``
and ``listen.py``), so a lost one delays a wake-up, never loses an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from wakeful.store.postgres.connection import Database

log = logging.getLogger("wakeful.store.postgres.notify")

NOTIFY_SQL = """
SELECT pg_notify(%s, t)
  FROM (SELECT set_config('synchronous_commit', 'off', true)) s, unnest(%s::text[]) t
"""
MAX_BATCH = 1000
"""Thread ids per round trip at most (each is one notification)."""
FAILURE_PAUSE = 0.5
"""Seconds the task waits after a failed round before it tries the next."""
CLOSE_TIMEOUT = 2.0
"""Seconds ``close`` gives the pending notifications before it gives up on them."""


class Notifier:
    """Coalesced, asynchronous ``pg_notify(channel, thread_id)`` for one store.

    ``local`` is called at once with each thread id (the store wakes its own waiters
    with it, without waiting for the server)."""

    def __init__(
        self, db: Database, channel: str, local: Callable[[str], None] | None = None
    ) -> None:
        self._db = db
        self._channel = channel
        self._local = local
        self._pending: set[str] = set()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._sending = False
        self._failing = False
        self.sent = 0
        """Notifications sent (for tests and metrics)."""
        self.rounds = 0
        """Round trips made (for tests and metrics)."""

    @property
    def pending(self) -> int:
        return len(self._pending)

    def notify(self, thread_id: str) -> None:
        """Announce ``thread_id`` on the store's channel soon. Never blocks, never raises."""
        if self._closed:
            return
        if self._local is not None:
            self._local(thread_id)
        self._pending.add(thread_id)
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="wakeful-notify")
        self._wakeup.set()

    async def flush(self) -> None:
        """Wait until nothing is pending or being sent (sent or dropped). For tests."""
        while (self._pending or self._sending) and self._task is not None:
            if self._task.done():
                return
            await asyncio.sleep(0.001)

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                if len(self._pending) <= MAX_BATCH:
                    batch, self._pending = self._pending, set()
                else:
                    batch = {self._pending.pop() for _ in range(MAX_BATCH)}
                if not await self._send(sorted(batch)) and not self._closed:
                    await asyncio.sleep(FAILURE_PAUSE)
            if self._closed:
                return

    async def _send(self, batch: list[str]) -> bool:
        self._sending = True
        try:
            async with self._db.pool.connection(timeout=self._db.timeout) as conn:
                await conn.execute(self._db.sql(NOTIFY_SQL), (self._channel, batch))
        except Exception as exc:  # a hint: waiters poll; never raised to a committer
            if not self._failing:
                log.warning(
                    "postgres store: %d notification(s) on %r dropped (%s); waiters fall back "
                    "to polling",
                    len(batch),
                    self._channel,
                    exc,
                )
            self._failing = True
            return False
        finally:
            self._sending = False
        if self._failing:
            log.info("postgres store: notifications on %r are sent again", self._channel)
        self._failing = False
        self.sent += len(batch)
        self.rounds += 1
        return True

    async def close(self) -> None:
        """Stop the task: what is pending is sent if that takes at most ``CLOSE_TIMEOUT``
        seconds, else dropped. Call before the pool closes. Idempotent; never hangs."""
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        if task is None or task.done():
            return
        self._wakeup.set()
        with contextlib.suppress(Exception):
            await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        self._pending.clear()
