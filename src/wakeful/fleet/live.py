"""Live channels: a run's message deltas, carried from the process producing them to the
processes streaming them to clients (``wakeful worker`` -> ``wakeful serve``).

A live channel is lossy by design, like a wake: a publish never blocks and never raises, a
delta sent while nobody listens (or while a connection is down) is gone. The stream server
never depends on it for correctness: the deltas carry their character offsets, and a gap is
filled from the run's stream checkpoint (``wakeful.server.feeds``). See
``docs/decisions/0019-live-streaming.md``.

- ``LocalLive``: one process (a worker and the server sharing an event loop; tests).
- ``PostgresLive`` (``wakeful.fleet.pglive``): ``NOTIFY`` on one channel per store.
- ``NatsLive`` (``wakeful.fleet.natslive``): one core NATS subject per thread.

A worker publishes through ``PublishingHub``, the runtime's live hub that also hands the
message events (``MESSAGE_EVENTS``) to a channel, batched per event-loop turn and thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from wakeful.runtime.events import LiveEvent, LiveHub

log = logging.getLogger("wakeful.fleet.live")

MESSAGE_EVENTS = frozenset(("message.started", "text.delta", "tool_call.delta"))
"""The live events a channel carries: where a model turn's attempt starts, and its deltas."""
MAX_PAYLOAD = 7_000
"""Bytes of one channel message at most (PostgreSQL's ``NOTIFY`` payload limit is 8000)."""
SPLIT_CHARS = 1_500
"""A delta longer than this is split (a character is at most 4 bytes of UTF-8)."""

Deliver = Callable[[LiveEvent], None]
Unsubscribe = Callable[[], Awaitable[None]]

_batch = msgspec.json.Decoder(list[LiveEvent])


@runtime_checkable
class LiveChannel(Protocol):
    def publish(self, events: Sequence[LiveEvent]) -> None:
        """Send ``events`` (one thread's, in order) soon. Never blocks, never raises."""
        ...

    async def subscribe(self, thread_id: str, deliver: Deliver) -> Unsubscribe:
        """Call ``deliver`` with each event published for ``thread_id`` from now on (in the
        order published by each producer). Returns once the subscription is in place, so
        events published after it returns are delivered unless the channel loses them."""
        ...

    async def close(self) -> None: ...


def thread_key(thread_id: str) -> str:
    """A fixed-length hex name for a thread, for subjects and channels that do not allow
    every id character."""
    return hashlib.sha256(thread_id.encode()).hexdigest()[:40]


def split(event: LiveEvent) -> list[LiveEvent]:
    """``event``, or a long delta as several consecutive deltas with adjusted offsets."""
    data = event.data
    if event.type not in ("text.delta", "tool_call.delta") or not isinstance(data, dict):
        return [event]
    field = "text" if event.type == "text.delta" else "arguments"
    value, offset = data.get(field), data.get("offset")
    if not isinstance(value, str) or not isinstance(offset, int) or len(value) <= SPLIT_CHARS:
        return [event]
    return [
        msgspec.structs.replace(
            event,
            data={**data, field: value[i : i + SPLIT_CHARS], "offset": offset + i},
        )
        for i in range(0, len(value), SPLIT_CHARS)
    ]


def encode(events: Sequence[LiveEvent], limit: int = MAX_PAYLOAD) -> list[bytes]:
    """JSON arrays of ``events`` in order, each at most ``limit`` bytes (an event too large
    even alone after ``split`` is dropped and logged)."""
    payloads: list[bytes] = []
    chunk: list[bytes] = []
    size = 2
    for whole in events:
        for event in split(whole):
            body = msgspec.json.encode(event)
            if len(body) + 2 > limit:
                log.warning("a live %s event of %d bytes is dropped", event.type, len(body))
                continue
            if chunk and size + len(body) + 1 > limit:
                payloads.append(b"[" + b",".join(chunk) + b"]")
                chunk, size = [], 2
            chunk.append(body)
            size += len(body) + 1
    if chunk:
        payloads.append(b"[" + b",".join(chunk) + b"]")
    return payloads


def decode(payload: bytes | str) -> list[LiveEvent]:
    """The events of one channel message; ``[]`` (logged) for anything malformed."""
    try:
        return _batch.decode(payload)
    except (msgspec.DecodeError, ValueError) as exc:
        log.warning("a malformed live channel message is ignored: %s", exc)
        return []


class Subscribers:
    """Per-thread delivery callbacks, shared by the channel implementations."""

    def __init__(self) -> None:
        self._by_thread: dict[str, list[Deliver]] = {}

    def add(self, thread_id: str, deliver: Deliver) -> bool:
        """Add; True when it is the thread's first subscriber."""
        callbacks = self._by_thread.setdefault(thread_id, [])
        callbacks.append(deliver)
        return len(callbacks) == 1

    def remove(self, thread_id: str, deliver: Deliver) -> bool:
        """Remove; True when the thread has no subscriber left."""
        callbacks = self._by_thread.get(thread_id)
        if callbacks is None:
            return False
        if deliver in callbacks:
            callbacks.remove(deliver)
        if callbacks:
            return False
        del self._by_thread[thread_id]
        return True

    def __contains__(self, thread_id: object) -> bool:
        return thread_id in self._by_thread

    def threads(self) -> list[str]:
        return list(self._by_thread)

    def deliver(self, events: Sequence[LiveEvent]) -> None:
        for event in events:
            for callback in list(self._by_thread.get(event.thread_id, ())):
                try:
                    callback(event)
                except Exception:  # one broken subscriber must not starve the others
                    log.exception("a live subscriber of %s failed", event.thread_id)


class LocalLive:
    """A live channel within one process (one event loop)."""

    def __init__(self) -> None:
        self._subscribers = Subscribers()
        self.published = 0
        """Events published (for tests and benchmarks)."""

    def publish(self, events: Sequence[LiveEvent]) -> None:
        self.published += len(events)
        self._subscribers.deliver(events)

    async def subscribe(self, thread_id: str, deliver: Deliver) -> Unsubscribe:
        self._subscribers.add(thread_id, deliver)

        async def unsubscribe() -> None:
            self._subscribers.remove(thread_id, deliver)

        return unsubscribe

    async def close(self) -> None:
        return None


class PublishingHub(LiveHub):
    """The runtime's live hub that also publishes message events to ``channel``: what the
    run's model turns stream becomes visible to stream servers in other processes.

    Events of one event-loop turn are handed over together, per thread, in order."""

    def __init__(self, channel: LiveChannel) -> None:
        super().__init__()
        self.channel = channel
        self._pending: dict[str, list[LiveEvent]] = {}
        self._scheduled = False

    def publish(self, thread_id: str, run_id: str, type: str, data: Any) -> None:
        super().publish(thread_id, run_id, type, data)
        if type not in MESSAGE_EVENTS:
            return
        event = LiveEvent(thread_id=thread_id, run_id=run_id, type=type, data=data)
        self._pending.setdefault(thread_id, []).append(event)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._send)

    def forwards(self, type: str) -> bool:
        return type in MESSAGE_EVENTS

    def _send(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for events in pending.values():
            try:
                self.channel.publish(events)
            except Exception:  # a hint: the stream server falls back to the checkpoint
                log.exception("publishing live events failed")


__all__ = [
    "MESSAGE_EVENTS",
    "LiveChannel",
    "LocalLive",
    "PublishingHub",
    "Subscribers",
    "decode",
    "encode",
    "split",
    "thread_key",
]
