"""A wake signal over PostgreSQL ``LISTEN``/``NOTIFY``.

``notify()`` runs ``SELECT pg_notify(channel, '')`` on a lazily opened autocommit connection
kept for the next notify, from a background send (``HintSender``): it waits for the send at
most ``NOTIFY_BOUND`` seconds, and the send itself gives up after ``NOTIFY_TIMEOUT``.
``wait()`` listens on a second, dedicated autocommit connection (opened and ``LISTEN``-ing
on the first wait or ``listen()``). Notifications that arrive while nobody waits stay
buffered on that connection, so the next wait returns at once.

Wakes are hints (see ``wakeful.fleet.wake``): nothing here raises for a lost or unreachable
server. A failed notify is logged and dropped; a wait whose listening connection is lost
logs a warning, sleeps out its timeout and returns False, and the next wait reconnects and
listens again. Notifications sent while no connection listened are lost; the worker's
polling floor picks that work up.

A frozen server or a network gone silent loses nothing either: a listening connection
quiet for ``HEALTH_INTERVAL`` seconds is probed, and a probe (or a notify) not answered
within its timeout counts as a lost connection (closed under the statement, see
``wakeful.store.postgres.probe``). A wait therefore returns within its timeout plus at
most ``PROBE_TIMEOUT``.

A burst coalesces: once a wait sees a notification, it makes one round trip on the
listening connection (PostgreSQL delivers every notification committed before it) and
discards everything received, so one wait returns True once per batch.

A queue that enqueues inside its own transaction can call ``pg_notify`` there with
``PostgresWake.channel``: the notification is then sent only if the enqueue commits.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import psycopg
from psycopg import sql

from wakeful.background import pause
from wakeful.errors import InvalidInput
from wakeful.fleet.wake import HintSender
from wakeful.ids import check_seconds
from wakeful.store.postgres.probe import PROBE_TIMEOUT, execute_within, probe

log = logging.getLogger("wakeful.fleet.pgwake")

DEFAULT_CHANNEL = "wakeful_dispatch"
CONNECT_TIMEOUT = 5
"""Seconds; libpq's floor is 2."""
WAIT_SLICE = 1.0
"""A wait looks at ``close()`` at least this often, whatever happens to the cancellation
``close()`` sends it."""
CLOSE_TIMEOUT = 2.0
"""Seconds ``close()`` waits for a wait in progress to end before it closes the connections
under it (with a warning)."""
NOTIFY_BACKOFF = 2.0
"""After a notify could not reach the server, notifies are dropped at once for this many
seconds (the background send does not hammer a server that is down)."""
NOTIFY_TIMEOUT = 2.0
"""Seconds one ``pg_notify`` may take before its connection counts as lost."""
HEALTH_INTERVAL = 5.0
"""Seconds a listening connection may stay quiet before a wait probes it."""
CONNECT_FLOOR = 0.5
"""Seconds a wait gives a (re)connection at least, even when its own timeout is shorter."""

_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def check_channel(channel: object) -> str:
    """A lowercase SQL identifier of at most 63 characters (PostgreSQL's ``NAMEDATALEN``),
    so ``LISTEN name``, ``NOTIFY name`` and ``pg_notify('name', ...)`` all agree."""
    if not isinstance(channel, str) or _CHANNEL.fullmatch(channel) is None:
        raise InvalidInput(
            "channel",
            f"{str(channel)[:70]!r} is not a lowercase identifier of at most 63 characters "
            f"([a-z_][a-z0-9_]*)",
        )
    return channel


class PostgresWake:
    """Wakes workers across processes through one PostgreSQL notification channel.

    One task waits on an object at a time (a second concurrent ``wait`` queues behind the
    first). ``close()`` interrupts a wait in progress, which then returns False; waits
    after ``close()`` return False at once."""

    def __init__(self, dsn: str, channel: str = DEFAULT_CHANNEL) -> None:
        self.dsn = dsn
        self.channel = check_channel(channel)
        self._listener: psycopg.AsyncConnection[object] | None = None
        self._notifier: psycopg.AsyncConnection[object] | None = None
        self._wait_lock = asyncio.Lock()
        self._waiting: asyncio.Task[bool] | None = None
        self._closed = False
        self._closing = asyncio.Event()
        self._notify_after = 0.0
        self._heard = 0.0
        """``loop.time()`` of the last sign of life on the listening connection."""
        self._sender = HintSender(f"postgres wake on {self.channel!r}", self._send, logger=log)

    @property
    def listener_pid(self) -> int | None:
        """The server process id of the listening connection, if one is open."""
        conn = self._listener
        return None if conn is None or conn.closed else conn.info.backend_pid

    async def _connect(self) -> psycopg.AsyncConnection[object]:
        conn: psycopg.AsyncConnection[object] = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        )
        return conn

    # ---------------------------------------------------------------- notify

    async def notify(self) -> None:
        """Send one notification, waiting for the send at most ``NOTIFY_BOUND`` seconds (it
        goes on in the background); on a lost connection the send reconnects once. Never
        raises for an unreachable server (logged at warning, then notifies are dropped at
        once for ``NOTIFY_BACKOFF`` seconds): the wake is a hint."""
        if not self._closed:
            await self._sender.notify()

    async def _send(self) -> None:
        if self._closed:
            return
        if self._notifier is None and time.monotonic() < self._notify_after:
            log.debug("postgres wake: server unreachable, the wake on %r is dropped", self.channel)
            return
        for attempt in (1, 2):
            try:
                if self._notifier is None or self._notifier.closed:
                    self._notifier = await self._connect()
                notify = "SELECT pg_notify(%s, '')"
                await execute_within(self._notifier, notify, (self.channel,), NOTIFY_TIMEOUT)
                return
            except psycopg.Error:
                await _discard(self._notifier)
                self._notifier = None
                if attempt == 2:
                    self._notify_after = time.monotonic() + NOTIFY_BACKOFF
                    raise

    # ---------------------------------------------------------------- wait

    async def listen(self) -> None:
        """Open the listening connection now (``wait`` does it too), so notifications sent
        from here on are buffered for the next wait. Raises ``psycopg.OperationalError`` if
        the server cannot be reached; ``wait`` never does."""
        async with self._wait_lock:
            await self._listening()

    async def _listening(self) -> psycopg.AsyncConnection[object]:
        if self._listener is not None and not self._listener.closed:
            return self._listener
        self._listener = None
        conn = await self._connect()
        try:
            listen = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))
            await execute_within(conn, listen, None, PROBE_TIMEOUT)
        except BaseException:
            await _discard(conn)
            raise
        self._listener = conn
        self._heard = asyncio.get_running_loop().time()
        return conn

    async def wait(self, timeout: float) -> bool:
        """True when a notification arrived within ``timeout`` seconds (or was buffered
        since the last wait); False on timeout, on a lost or unreachable server (after
        sleeping out the timeout) and once the wake is closed."""
        timeout = check_seconds("timeout", timeout, allow_zero=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with self._wait_lock:
            if self._closed:
                return False
            self._waiting = asyncio.ensure_future(self._wait(deadline))
            try:
                return await self._waiting
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self.closed and (current is None or current.cancelling() == 0):
                    return False  # close() interrupted the wait, the caller was not cancelled
                raise
            finally:
                self._waiting = None

    async def _wait(self, deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(max(deadline - loop.time(), CONNECT_FLOOR)):
                conn = await self._listening()
            received = False
            while not received and not self._closed:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                if loop.time() - self._heard >= HEALTH_INTERVAL:
                    await probe(conn)  # a frozen server or a silent network fails here
                    self._heard = loop.time()
                    continue
                async for _ in conn.notifies(timeout=min(remaining, WAIT_SLICE), stop_after=1):
                    received = True
            if received:
                # Every notification committed before this round trip is delivered before
                # its answer: discard them all, one wake per batch.
                await probe(conn)
                async for _ in conn.notifies(timeout=0):
                    pass
                self._heard = loop.time()
            return received
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning(
                "postgres wake: the connection listening on %r was lost or could not be "
                "opened; treating this wait as a timeout and reconnecting on the next: %s",
                self.channel,
                exc,
            )
            await _discard(self._listener)
            self._listener = None
            await pause(self._closing, max(0.0, deadline - loop.time()))
            return False

    @property
    def closed(self) -> bool:
        return self._closed

    # ---------------------------------------------------------------- close

    async def close(self) -> None:
        """Interrupt a wait in progress and close both connections; idempotent. A wait that
        does not end within ``CLOSE_TIMEOUT`` seconds is abandoned (with a warning) and its
        connection closed under it."""
        self._closed = True
        self._closing.set()
        if self._waiting is not None:
            self._waiting.cancel()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self._wait_lock.acquire()
        except TimeoutError:
            log.warning(
                "postgres wake: a wait on %r did not end within %.1f s of close(); closing "
                "its connection under it",
                self.channel,
                CLOSE_TIMEOUT,
            )
        else:
            self._wait_lock.release()
        await _discard(self._listener)
        self._listener = None
        await self._sender.close()
        await _discard(self._notifier)
        self._notifier = None

    async def __aenter__(self) -> PostgresWake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _discard(conn: psycopg.AsyncConnection[object] | None) -> None:
    if conn is None:
        return
    try:
        await conn.close()
    except psycopg.Error as exc:  # pragma: no cover - close of a broken connection
        log.debug("postgres wake: closing a connection failed: %s", exc)
