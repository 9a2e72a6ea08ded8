"""A wake signal over core NATS publish/subscribe.

One NATS connection per object, opened on first use. ``notify()`` publishes an empty
message on the subject from a background send (``HintSender``) and waits for it at most
``NOTIFY_BOUND`` seconds; ``wait()`` subscribes (once) and returns True when a message
arrived since the last wait. Messages set one flag, so a burst coalesces into one wake.
Core NATS keeps nothing for a subscriber that is not connected: a notification sent while
this object is disconnected is lost, and the worker's polling floor finds the work.

A dead connection is replaced, whatever nats-py believes:

- nats-py pings the server every ``PING_INTERVAL`` seconds; ``MAX_OUTSTANDING_PINGS``
  unanswered pings (a frozen server, a silent network) make it drop the connection and
  reconnect (it retries for ever and restores the subscription);
- a client whose read loop has ended while it still reports itself connected (nats-py
  ends it on an unexpected error and only logs it) is closed and a new one opened by the
  next ``wait`` or ``notify``;
- nothing here calls ``flush`` with a timeout on a live connection: a flush that times
  out leaves a cancelled future that the server's late answer crashes nats-py's read loop
  with (``InvalidStateError`` in ``_process_pong``), which is how a frozen server used to
  leave a worker deaf for good.

Nothing here raises for an unreachable server: a failed notify is logged and dropped, and a
wait that cannot connect logs a warning, sleeps out its timeout and returns False; the next
wait tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from wakeful.background import pause
from wakeful.errors import InvalidInput
from wakeful.fleet.wake import NOTIFY_BOUND, HintSender
from wakeful.ids import check_seconds

log = logging.getLogger("wakeful.fleet.natswake")

DEFAULT_SUBJECT = "wakeful.dispatch"
CONNECT_TIMEOUT = 5.0
"""Seconds to open a connection (and to wait for the server's first answer on it)."""
NOTIFY_BACKOFF = 2.0
"""After a notify could not connect, notifies are dropped at once for this many seconds."""
SUBSCRIBE_TIMEOUT = 2
"""Seconds the round trip after subscribing may take (on a new connection only)."""
DRAIN_TIMEOUT = 2
CLOSE_TIMEOUT = 2.0
"""Seconds closing (or draining) a connection may take before it is abandoned."""
PING_INTERVAL = 2
"""Seconds between nats-py's pings on an idle connection (an int: nats-py's type)."""
MAX_OUTSTANDING_PINGS = 2
"""Unanswered pings after which the connection counts as dead and is reconnected, so a
frozen server or a silent network is noticed within about ``(MAX_OUTSTANDING_PINGS + 1) *
PING_INTERVAL`` seconds."""

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


def deaf(client: Client) -> bool:
    """The client says it is connected but its read loop has ended: it receives nothing
    (no messages, no pongs) and nats-py will not notice before its ping limit."""
    reading: asyncio.Task[None] | None = getattr(client, "_reading_task", None)
    return client.is_connected and reading is not None and reading.done()


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
        self._sender = HintSender(f"nats wake on {self.subject!r}", self._send, logger=log)
        self.connections = 0
        """Connections opened (a replaced dead one counts again), for tests and metrics."""
        self.received = 0
        """Wake messages delivered to this subscriber, for tests and metrics."""

    # ---------------------------------------------------------------- connection

    async def _connection(self, timeout: float) -> Client:
        """The connected (or reconnecting) client, connecting and subscribing first if
        needed (replacing a deaf one), within ``timeout`` seconds."""
        async with self._lock:
            if self._closed:
                raise RuntimeError("the wake is closed")
            client = self._client
            if client is not None and not client.is_closed:
                if not deaf(client):
                    return client
                log.warning(
                    "nats wake on %r: the connection stopped reading while it reported "
                    "itself connected; replacing it",
                    self.subject,
                )
                self._client = None
                await _close(client)
            client = Client()
            try:
                async with asyncio.timeout(timeout):
                    await client.connect(
                        self.url,
                        connect_timeout=max(1, round(min(timeout, CONNECT_TIMEOUT))),
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=1,
                        ping_interval=PING_INTERVAL,
                        max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                        drain_timeout=DRAIN_TIMEOUT,
                        error_cb=self._on_error,
                        disconnected_cb=self._on_disconnected,
                        reconnected_cb=self._on_reconnected,
                    )
                    await client.subscribe(self.subject, cb=self._on_message)
                    # A round trip: the server has the subscription before this returns. A
                    # timeout here closes the new client, so its late pong harms nothing.
                    await client.flush(timeout=SUBSCRIBE_TIMEOUT)
            except BaseException:
                await _close(client)
                raise
            self._client = client
            self.connections += 1
            return client

    async def listen(self) -> None:
        """Connect and subscribe now (``wait`` does it too), so messages published from
        here on wake the next wait. Raises if the server cannot be reached; ``wait`` never
        does."""
        await self._connection(CONNECT_TIMEOUT)

    async def _on_message(self, msg: Msg) -> None:
        self.received += 1
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
        """Publish one wake, waiting for the send at most ``NOTIFY_BOUND`` seconds (it goes
        on in the background). Never raises for an unreachable server (logged at warning);
        a notify while disconnected is dropped rather than buffered, and for
        ``NOTIFY_BACKOFF`` seconds after a failed connect notifies are dropped at once."""
        if not self._closed:
            await self._sender.notify()

    async def _send(self) -> None:
        if self._closed:
            return
        disconnected = self._client is None or self._client.is_closed
        if disconnected and time.monotonic() < self._notify_after:
            log.debug("nats wake on %r: server unreachable, the wake is dropped", self.subject)
            return
        try:
            client = await self._connection(CONNECT_TIMEOUT)
        except Exception:
            self._notify_after = time.monotonic() + NOTIFY_BACKOFF
            raise
        if not client.is_connected:
            log.warning("nats wake on %r: not connected, the wake is dropped", self.subject)
            return
        # Queued for nats-py's flusher: no round trip, so nothing here waits on the server.
        await client.publish(self.subject, b"")

    async def wait(self, timeout: float) -> bool:
        """True when a message arrived within ``timeout`` seconds (or since the last wait);
        False on timeout, when the server cannot be reached (after sleeping out the
        timeout) and once the wake is closed."""
        timeout = check_seconds("timeout", timeout, allow_zero=True)
        if self._closed:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._client is None or self._client.is_closed or deaf(self._client):
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
        """Wake a wait in progress, stop sending, drain the subscription and close;
        idempotent. Each step is bounded (``CLOSE_TIMEOUT``)."""
        self._closed = True
        self._closing.set()
        self._event.set()
        await self._sender.close()
        async with self._lock:
            client, self._client = self._client, None
        if client is not None and not client.is_closed:
            await _close(client, drain=client.is_connected and not deaf(client))

    async def __aenter__(self) -> NatsWake:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def _close(client: Client, *, drain: bool = False) -> None:
    """Drain (when asked) or close ``client`` within ``CLOSE_TIMEOUT``; never raises."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT):
            if drain:
                await client.drain()
            else:
                await client.close()
    except Exception as exc:
        log.debug("nats wake: closing a connection failed (%s); closing it", exc)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await client.close()


__all__ = ["DEFAULT_SUBJECT", "NOTIFY_BOUND", "NatsWake", "check_subject", "deaf"]
