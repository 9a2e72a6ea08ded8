"""Wake-ups for ``wait_events`` from PostgreSQL ``LISTEN/NOTIFY``.

After a commit that added events (and a ``delete_thread``) returned, the store sends
``pg_notify(channel, thread_id)`` in a transaction of its own (``notify.py``) and wakes its
own waiters at once (``wake``). The store owns one dedicated connection that ``LISTEN``s on
the schema's channel, opened on first use, and announces itself with a session-level
advisory lock, without which notifiers do not send (``notify.py``).

Notifications are hints, never the source of truth: a woken waiter re-reads events by
sequence number. That makes a lost connection harmless: while it is down waiters fall back to
polling, and when it comes back (or goes away) every waiter is woken to re-check, so a
commit made while nobody listened is still seen; once more ``PRESENCE_RECHECK`` later, for
commits of notifiers that had just found nobody listening (``notify.py``).

The connection is probed (``SELECT 1``) every ``health_interval`` seconds when idle, and a
probe not answered within ``probe_timeout`` seconds counts as a lost connection (it is
closed under the probe, see ``probe.py``): a frozen server or a network that went silent
is noticed within ``health_interval + probe_timeout`` seconds, after which waiters poll
and the listener reconnects (with backoff) until the server answers again.
"""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
from psycopg import sql

from wakeful.background import BackgroundTask, StopSignal
from wakeful.backoff import backoff_delay
from wakeful.store.postgres import notify
from wakeful.store.postgres.probe import PROBE_TIMEOUT, execute_within, probe

RECHECK_MARGIN = 0.05
"""Seconds added to ``notify.PRESENCE_RECHECK`` before the waiters' second re-check."""

CLOSE_TIMEOUT = 2.0
"""Seconds ``close`` waits for the listening task after interrupting it, and again after
cancelling it once more, before it abandons it."""

APPLICATION_NAME = "wakeful-listen"
"""The ``application_name`` of the LISTEN connection, to find it in ``pg_stat_activity``."""


class Listener:
    """One LISTEN connection and the futures of the tasks waiting for a thread."""

    def __init__(
        self,
        conninfo: str,
        channel: str,
        *,
        health_interval: float = 5.0,
        probe_timeout: float = PROBE_TIMEOUT,
        reconnect_delay: float = 0.2,
        max_reconnect_delay: float = 2.0,
        enabled: bool = True,
    ) -> None:
        self._conninfo = conninfo
        self.enabled = enabled
        """False behind a transaction pooler without a direct URL: nothing listens and
        waiters rely on polling alone."""
        self._channel = channel
        self._health_interval = health_interval
        self._probe_timeout = probe_timeout
        self._reconnect_delay = reconnect_delay
        self._max_reconnect_delay = max_reconnect_delay
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._task: BackgroundTask | None = None
        self._listening: asyncio.Event | None = None
        self._closed = False
        self._recheck: asyncio.TimerHandle | None = None
        self.connects = 0
        """How many times LISTEN was (re-)established; for tests and metrics."""

    @property
    def listening(self) -> bool:
        return self._listening is not None and self._listening.is_set()

    def subscribe(self, thread_id: str) -> asyncio.Future[None]:
        """A future completed at the next notification for ``thread_id`` (or any reconnect).
        Pass it to ``unsubscribe`` when done."""
        self._start()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(thread_id, set()).add(waiter)
        return waiter

    def waiting(self, thread_id: str) -> int:
        """How many tasks wait for a notification of ``thread_id`` (for tests and metrics)."""
        return len(self._waiters.get(thread_id, ()))

    def unsubscribe(self, thread_id: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(thread_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[thread_id]

    async def ready(self, timeout: float) -> bool:
        """Start listening if needed and wait up to ``timeout`` seconds until LISTEN is
        active. False if it is not (the caller then relies on polling)."""
        if not self.enabled:
            return False
        self._start()
        assert self._listening is not None
        if self._listening.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), timeout)
        return self._listening.is_set()

    def _start(self) -> None:
        if not self.enabled or self._closed or (self._task is not None and self._task.running):
            return
        if self._listening is None:
            self._listening = asyncio.Event()
        self._task = BackgroundTask(APPLICATION_NAME, self._run, stop_timeout=CLOSE_TIMEOUT)
        self._task.start()

    def wake(self, thread_id: str) -> None:
        """Complete the waiters of ``thread_id`` now (a write through this store)."""
        self._wake(thread_id)

    def _wake(self, thread_id: str) -> None:
        for waiter in self._waiters.pop(thread_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for group in waiters.values():
            for waiter in group:
                if not waiter.done():
                    waiter.set_result(None)

    async def _run(self, signal: StopSignal) -> None:
        assert self._listening is not None
        failures = 0  # in a row, since the last connection that listened
        while not signal.is_set():
            conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=APPLICATION_NAME,
                )
                listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
                await execute_within(conn, listen, None, self._probe_timeout)
                # Notifiers send only while some listener holds this (see notify.py).
                await execute_within(
                    conn, notify.LISTENER_PRESENCE_SQL, (self._channel,), self._probe_timeout
                )
                self.connects += 1
                self._listening.set()
                # Commits made while nobody listened: every waiter re-checks by seq. A
                # notifier that found nobody just before we announced ourselves skips its
                # rounds for up to PRESENCE_RECHECK more: re-check once more after that.
                self._wake_all()
                self._schedule_recheck(notify.PRESENCE_RECHECK + RECHECK_MARGIN)
                failures = 0
                while not signal.is_set():
                    async for note in conn.notifies(timeout=self._health_interval):
                        self._wake(note.payload)
                    await probe(conn, self._probe_timeout)  # a dead or frozen one fails here
            except (psycopg.Error, OSError):
                pass  # lost or refused: fall back to polling and reconnect below
            finally:
                self._listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            if signal.is_set():
                break
            self._wake_all()
            failures += 1
            delay = backoff_delay(failures, self._reconnect_delay, self._max_reconnect_delay)
            if await signal.pause(delay):
                break

    def _schedule_recheck(self, delay: float) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
        self._recheck = asyncio.get_running_loop().call_later(delay, self._wake_all)

    async def close(self) -> None:
        """Stop listening: the task is told to stop and interrupted (it blocks in waits on
        the connection); it ends by its signal even if the interruption is swallowed, and is
        abandoned with a warning if it still runs after twice ``CLOSE_TIMEOUT``."""
        self._closed = True
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if self._task is not None:
            await self._task.stop(interrupt=True)
            self._task = None
        self._wake_all()
