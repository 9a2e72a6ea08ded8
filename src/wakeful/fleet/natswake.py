"""A wake signal over core NATS publish/subscribe.

One NATS connection per object, opened on first use: ``notify()`` publishes an empty
message on the subject and flushes; ``wait()`` subscribes (once) and returns True when a
message arrived since the last wait. Messages set one flag, so a burst coalesces into one
wake. Core NATS keeps nothing for a subscriber that is not connected: a notification sent
while this object is disconnected is lost, and the worker's polling floor finds the work.

Reconnecting after a lost connection is nats-py's job (it retries for ever and restores the
subscription). Nothing here raises for an unreachable server: a failed notify is logged and
dropped, and a wait that cannot connect logs a warning, sleeps out its timeout and returns
False; the next wait tries again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from wakeful.background import pause
from wakeful.errors import InvalidInput
from wakeful.ids import check_seconds

log = logging.getLogger("wakeful.fleet.natswake")

DEFAULT_SUBJECT = "wakeful.dispatch"
CONNECT_TIMEOUT = 5.0
NOTIFY_CONNECT_TIMEOUT = 1.0
NOTIFY_BACKOFF = 2.0
"""After a notify could not connect, notifies are dropped at once for this many seconds."""
FLUSH_TIMEOUT = 2
DRAIN_TIMEOUT = 2

_SUBJECT = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")


def check_subject(subject: object) -> str:
    """A literal NATS subject (dot-separated tokens of ``[A-Za-z0-9_-]``, no wildcards)."""
    if not isinstance(subject, str) or len(subject) > 255 or not _SUBJECT.fullmatch(subject):
        raise InvalidInput(
            "subject",
            f"{str(subject)[:70]!r} is not a literal NATS subject (dot-separated tokens of "
            f"[A-Za-z0-9_-], at most 255 characters)",
        )
    return subject


class NatsWake:
    """Wakes workers across processes through one NATS subject.

    ``close()`` wakes a wait in progress, which then returns False; waits after ``close()``
    return False at once."""

    def __init__(self, url: str, subject: str = DEFAULT_SUBJECT) -> None:
        self.url = url
        self.subject = check_subject(subject)
        self._client: Client | None = None
        self._event = asyncio.Event()
        self._lock = asyncio.Lock()
        self._closed = False
        self._closing = asyncio.Event()
        self._notify_after = 0.0

    # ---------------------------------------------------------------- connection

    async def _connection(self, timeout: float) -> Client:
        """The connected (or reconnecting) client, connecting and subscribing first if
        needed, within ``timeout`` seconds."""
        async with self._lock:
            if self._closed:
                raise RuntimeError("the wake is closed")
            if self._client is not None and not self._client.is_closed:
                return self._client
            client = Client()
            try:
                await asyncio.wait_for(
                    client.connect(
                        self.url,
                        connect_timeout=int(CONNECT_TIMEOUT),
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=1,
                        drain_timeout=DRAIN_TIMEOUT,
                        error_cb=self._on_error,
                        disconnected_cb=self._on_disconnected,
                        reconnected_cb=self._on_reconnected,
                    ),
                    timeout,
                )
                await client.subscribe(self.subject, cb=self._on_message)
                # A round trip: the server has the subscription before this returns.
                await client.flush(timeout=FLUSH_TIMEOUT)
            except BaseException:
                await client.close()
                raise
            self._client = client
            return client

    async def listen(self) -> None:
        """Connect and subscribe now (``wait`` does it too), so messages published from
        here on wake the next wait. Raises if the server cannot be reached; ``wait`` never
        does."""
        await self._connection(CONNECT_TIMEOUT)

    async def _on_message(self, msg: Msg) -> None:
        self._event.set()

    async def _on_error(self, exc: Exception) -> None:
        log.warning("nats wake on %r: %s: %s", self.subject, type(exc).__name__, exc)

    async def _on_disconnected(self) -> None:
        if not self._closed:
            log.warning("nats wake on %r: disconnected; nats-py reconnects", self.subject)

    async def _on_reconnected(self) -> None:
        log.info("nats wake on %r: reconnected", self.subject)

    @property
    def closed(self) -> bool:
        return self._closed

    # ---------------------------------------------------------------- notify / wait

    async def notify(self) -> None:
        """Publish one wake and flush. Never raises for an unreachable server (logged at
        warning); a notify while disconnected is dropped rather than buffered, and for
        ``NOTIFY_BACKOFF`` seconds after a failed connect notifies are dropped at once."""
        if self._closed:
            return
        disconnected = self._client is None or self._client.is_closed
        if disconnected and time.monotonic() < self._notify_after:
            log.debug("nats wake on %r: server unreachable, the wake is dropped", self.subject)
            return
        try:
            client = await self._connection(NOTIFY_CONNECT_TIMEOUT)
            if not client.is_connected:
                log.warning("nats wake on %r: not connected, the wake is dropped", self.subject)
                return
            await client.publish(self.subject, b"")
            await client.flush(timeout=FLUSH_TIMEOUT)
        except Exception as exc:
            if self._client is None or self._client.is_closed:
                self._notify_after = time.monotonic() + NOTIFY_BACKOFF
            log.warning(
                "nats wake: notify on %r failed, the wake is dropped (workers still poll): %s: %s",
                self.subject,
                type(exc).__name__,
                exc,
            )

    async def wait(self, timeout: float) -> bool:
        """True when a message arrived within ``timeout`` seconds (or since the last wait);
        False on timeout, when the server cannot be reached (after sleeping out the
        timeout) and once the wake is closed."""
        timeout = check_seconds("timeout", timeout, allow_zero=True)
        if self._closed:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._client is None or self._client.is_closed:
            try:
                await self._connection(max(timeout, 0.001))
            except Exception as exc:
                if self.closed:
                    return False
                log.warning(
                    "nats wake: cannot listen on %r, treating this wait as a timeout: %s: %s",
                    self.subject,
                    type(exc).__name__,
                    exc,
                )
                await pause(self._closing, max(0.0, deadline - loop.time()))
                return False
        # ``close()`` sets the event too: the wait ends on that flag, not on cancellation
        if not await pause(self._event, max(0.0, deadline - loop.time())):
            return False
        self._event.clear()
        return not self.closed

    async def close(self) -> None:
        """Wake a wait in progress, drain the subscription and close; idempotent."""
        self._closed = True
        self._closing.set()
        self._event.set()
        async with self._lock:
            client, self._client = self._client, None
            if client is None or client.is_closed:
                return
            try:
                if client.is_connected:
                    await client.drain()
                else:
                    await client.close()
            except Exception as exc:
                log.debug("nats wake: drain failed (%s); closing", exc)
                await client.close()

    async def __aenter__(self) -> NatsWake:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
