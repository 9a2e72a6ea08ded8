"""Sending the store's notifications after the write, never inside it, and only while
somebody listens.

A PostgreSQL transaction that ``NOTIFY``s takes a cluster-wide lock at commit and holds it
through its WAL flush, so committers that notify are serialised and lose group commit. The
store's writes therefore never notify: after a write returned, the store hands the thread id
to its ``Notifier`` and goes on. One background task per store drains the pending ids, all of
them per round trip, with one statement on a pooled connection (``NOTIFY_SQL``).
``set_config('synchronous_commit', 'off', true)`` is ``SET LOCAL``: that transaction alone
commits asynchronously, so it neither waits for a WAL flush nor holds the notification lock
through one.

**Presence.** A notification nobody receives still costs a round trip, a transaction and the
server's notification queue, once per commit of a sequential writer. So a listener announces
itself: its LISTEN connection holds the session-level shared advisory lock
``hashtextextended(channel, 0)`` (``LISTENER_PRESENCE_SQL``; PostgreSQL drops it with the
session). Each round also tries that lock exclusively for the length of its own transaction
and notifies only if the try fails, i.e. only if a listener holds it; the answer is kept, and
while it is "nobody" the notifier sends nothing for ``PRESENCE_RECHECK`` seconds (counted
from before the round was sent). A listener that appears is therefore noticed within that
time; to cover commits made in between, the listener wakes its waiters to re-check once more
when that time has passed since it announced itself (``listen.py``).

A notification is a hint. A committer never waits for it; a failed round is logged and
dropped; a notification still pending when the process dies is lost. Waiters re-check by
sequence number at least every ``poll_interval`` seconds (see ``PostgresStore.wait_events``
and ``listen.py``), so a lost one delays a wake-up, never loses an event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from wakeful.background import BackgroundTask, StopSignal
from wakeful.store.postgres.connection import Database

log = logging.getLogger("wakeful.store.postgres.notify")

NOTIFY_SQL = """
WITH presence AS MATERIALIZED (
  SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
         NOT pg_try_advisory_xact_lock(hashtextextended(%(channel)s, 0)) AS listened)
SELECT listened,
       (SELECT count(pg_notify(%(channel)s, t)) FROM unnest(%(ids)s::text[]) t WHERE listened)
  FROM presence
"""
LISTENER_PRESENCE_SQL = "SELECT pg_advisory_lock_shared(hashtextextended(%s, 0))"
"""Run on a LISTEN connection (session-level; released when the session ends) so that
notifiers send to ``%s``, the channel."""
PRESENCE_RECHECK = 0.25
"""Seconds a notifier that found no listener sends nothing before it looks again."""
MAX_BATCH = 1000
"""Thread ids per round trip at most (each is one notification)."""
FAILURE_PAUSE = 0.5
"""Seconds the task waits after a failed round before it tries the next."""
CLOSE_TIMEOUT = 2.0
"""Seconds ``close`` gives the pending notifications before it cancels the task (and again
before it abandons it)."""


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
        self._task: BackgroundTask | None = None
        self._closed = False
        self._sending = False
        self._failing = False
        self._listened = True  # until a round says otherwise
        self._listened_at = 0.0
        self.sent = 0
        """Notifications sent (for tests and metrics)."""
        self.rounds = 0
        """Round trips made (for tests and metrics)."""
        self.unheard = 0
        """Notifications not sent because no listener was present (for tests and metrics)."""

    @property
    def pending(self) -> int:
        return len(self._pending)

    def notify(self, thread_id: str) -> None:
        """Announce ``thread_id`` on the store's channel soon. Never blocks, never raises."""
        if self._closed:
            return
        if self._local is not None:
            self._local(thread_id)
        if self._nobody_listens():
            self.unheard += 1
            return
        self._pending.add(thread_id)
        if self._task is None or not self._task.running:
            self._wakeup = asyncio.Event()
            self._task = BackgroundTask(
                "wakeful-notify", self._run, stop_timeout=CLOSE_TIMEOUT, logger=log
            )
            self._task.start()
        self._wakeup.set()

    def _nobody_listens(self) -> bool:
        """The last round found no listener, recently enough to believe it."""
        return not self._listened and time.monotonic() - self._listened_at < PRESENCE_RECHECK

    async def flush(self) -> None:
        """Wait until nothing is pending or being sent (sent or dropped). For tests."""
        while (self._pending or self._sending) and self._task is not None:
            if not self._task.running:
                return
            await asyncio.sleep(0.001)

    async def _run(self, signal: StopSignal) -> None:
        """Rounds until stopped: ``close`` sets ``signal`` after ``_closed`` and a wake-up,
        so what is pending is sent first; the loop ends at the first look after that."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                if len(self._pending) <= MAX_BATCH:
                    batch, self._pending = self._pending, set()
                else:
                    batch = {self._pending.pop() for _ in range(MAX_BATCH)}
                if self._nobody_listens():
                    self.unheard += len(batch)
                    continue
                if not await self._send(sorted(batch)) and not self._closed:
                    await signal.pause(FAILURE_PAUSE)
            if signal.is_set() or self._closed:
                return

    async def _send(self, batch: list[str]) -> bool:
        self._sending = True
        # Taken before the round: the "nobody listens" it may return is then trusted until
        # at most PRESENCE_RECHECK after the server looked (listen.py relies on that bound).
        started = time.monotonic()
        try:
            # (on a caller's pool not in autocommit, a bounded transaction: the advisory
            # lock it may take stops new listeners from announcing themselves until COMMIT)
            async with self._db.connection() as conn:
                cur = await conn.execute(
                    self._db.sql(NOTIFY_SQL), {"channel": self._channel, "ids": batch}
                )
                row = await cur.fetchone()
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
        self._listened = bool(row[0]) if row is not None else True
        self._listened_at = started
        if self._listened:
            self.sent += len(batch)
        else:
            self.unheard += len(batch)
        self.rounds += 1
        return True

    async def close(self) -> None:
        """Stop the task: what is pending is sent if that takes at most ``CLOSE_TIMEOUT``
        seconds, else dropped (the task is cancelled, and abandoned with a warning if it
        still runs ``CLOSE_TIMEOUT`` later). Call before the pool closes. Idempotent; never
        hangs."""
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            self._wakeup.set()
            await task.stop()
        self._pending.clear()
