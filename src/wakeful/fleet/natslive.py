"""A live channel over core NATS (see ``wakeful.fleet.live``).

Each thread has its own subject, ``<prefix>.<thread_key(thread_id)>``, so a stream server
receives only the threads it streams. A publish hands the payload to nats-py's buffer (its
flusher sends it at once, coalescing what accumulates meanwhile); nothing is kept for a
subscriber that is not connected. nats-py reconnects for ever and restores subscriptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from wakeful.fleet.live import Deliver, Subscribers, Unsubscribe, decode, encode, thread_key
from wakeful.fleet.natswake import check_subject
from wakeful.runtime.events import LiveEvent

log = logging.getLogger("wakeful.fleet.natslive")

DEFAULT_PREFIX = "wakeful.live"
CONNECT_TIMEOUT = 5.0
MAX_PAYLOAD = 64_000
MAX_QUEUED = 10_000
"""Payloads waiting for the connection at most; beyond it new ones are dropped."""
RECONNECT_DELAY = 0.5


class NatsLive:
    """``NatsLive(url, prefix="wakeful.live")``: publish and subscribe."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX) -> None:
        self.url = url
        self.prefix = check_subject(prefix)
        self._client: Client | None = None
        self._subscribers = Subscribers()
        self._subscriptions: dict[str, Subscription] = {}
        self._lock = asyncio.Lock()
        self._closed = False
        self._queued: deque[tuple[str, bytes]] = deque()
        self._wakeup = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self.sent = 0
        """Payloads handed to NATS (for tests and benchmarks)."""
        self.dropped = 0

    def subject(self, thread_id: str) -> str:
        return f"{self.prefix}.{thread_key(thread_id)}"

    async def _connect(self) -> Client:
        async with self._lock:
            if self._client is not None and not self._client.is_closed:
                return self._client
            client = Client()
            await asyncio.wait_for(
                client.connect(
                    self.url,
                    connect_timeout=int(CONNECT_TIMEOUT),
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    error_cb=self._on_error,
                ),
                CONNECT_TIMEOUT,
            )
            self._client = client
            return client

    async def _on_error(self, exc: Exception) -> None:
        log.warning("nats live channel: %s: %s", type(exc).__name__, exc)

    # ---------------------------------------------------------------- publish

    def publish(self, events: Sequence[LiveEvent]) -> None:
        if self._closed or not events:
            return
        subject = self.subject(events[0].thread_id)
        for payload in encode(events, MAX_PAYLOAD):
            if len(self._queued) >= MAX_QUEUED:
                self.dropped += 1
                continue
            self._queued.append((subject, payload))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_loop())
        self._wakeup.set()

    async def _send_loop(self) -> None:
        """One sender, so payloads leave in the order they were published."""
        while not self._closed:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                client = await self._connect()
            except Exception as exc:
                self.dropped += len(self._queued)
                self._queued.clear()
                log.warning(
                    "nats live channel: cannot reach %s (deltas dropped): %s", self.url, exc
                )
                await asyncio.sleep(RECONNECT_DELAY)
                continue
            while self._queued and not self._closed:
                subject, payload = self._queued.popleft()
                if not client.is_connected:
                    self.dropped += 1
                    continue
                try:
                    await client.publish(subject, payload)
                    self.sent += 1
                except Exception as exc:
                    self.dropped += 1
                    log.debug("nats live channel: publish failed: %s", exc)

    # ---------------------------------------------------------------- subscribe

    async def subscribe(self, thread_id: str, deliver: Deliver) -> Unsubscribe:
        client = await self._connect()
        if self._subscribers.add(thread_id, deliver):

            async def on_message(msg: Msg) -> None:
                self._subscribers.deliver(decode(msg.data))

            self._subscriptions[thread_id] = await client.subscribe(
                self.subject(thread_id), cb=on_message
            )
            await client.flush(timeout=2)  # the server has the subscription before we return

        async def unsubscribe() -> None:
            if self._subscribers.remove(thread_id, deliver):
                sub = self._subscriptions.pop(thread_id, None)
                if sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()

        return unsubscribe

    async def close(self) -> None:
        self._closed = True
        self._wakeup.set()
        if self._sender is not None and not self._sender.done():
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender
        client, self._client = self._client, None
        if client is not None and not client.is_closed:
            with contextlib.suppress(Exception):
                await client.close()


__all__ = ["DEFAULT_PREFIX", "NatsLive"]
