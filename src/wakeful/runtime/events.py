"""Subscriptions: durable events from the store (any process, no gap, no duplicate,
resumable from a seq) merged with this process's live events (never stored)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from wakeful.records import Event
from wakeful.store.contract import ThreadStore


class LiveEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A progress event seen only by subscribers in the emitting process."""

    thread_id: str
    run_id: str
    type: str
    data: Any = None


class LiveHub:
    """Fans live events out to this process's subscribers of a thread."""

    def __init__(self) -> None:
        self._queues: dict[str, set[asyncio.Queue[Event | LiveEvent | BaseException]]] = {}
        self._lock = threading.Lock()
        self._batches: dict[asyncio.AbstractEventLoop, list[tuple[str, str, str, Any]]] = {}

    def publish(self, thread_id: str, run_id: str, type: str, data: Any) -> None:
        """Deliver now (call on the subscribers' event loop)."""
        event = LiveEvent(thread_id=thread_id, run_id=run_id, type=type, data=data)
        for queue in self._queues.get(thread_id, ()):
            queue.put_nowait(event)

    def emit(
        self, loop: asyncio.AbstractEventLoop, thread_id: str, run_id: str, type: str, data: Any
    ) -> None:
        """Deliver soon on ``loop``, from any thread: events are handed over in batches, one
        loop callback per batch (``call_soon_threadsafe`` per event, which wakes the loop
        through its self-pipe, cost about 22 µs a delta). An event for a thread nobody
        subscribes to in this process is dropped at once (unless ``forwards`` it): live
        events are never stored."""
        if not self.wants(thread_id, type):
            return
        with self._lock:
            batch = self._batches.get(loop)
            if batch is not None:
                batch.append((thread_id, run_id, type, data))
                return
            self._batches[loop] = [(thread_id, run_id, type, data)]
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        try:
            if on_loop:
                loop.call_soon(self._flush, loop)
            else:
                loop.call_soon_threadsafe(self._flush, loop)
        except RuntimeError:  # the loop is closed: nobody is left to deliver to
            with self._lock:
                self._batches.pop(loop, None)

    def wants(self, thread_id: str, type: str) -> bool:
        """Whether ``emit`` would deliver an event of ``type`` on ``thread_id`` now (somebody
        subscribes to the thread here, or it is forwarded): a producer checks this before
        building an event that would be dropped (a model delta, thousands a second)."""
        return thread_id in self._queues or self.forwards(type)

    def forwards(self, type: str) -> bool:
        """Whether events of ``type`` go beyond this process's subscribers (a subclass that
        publishes them elsewhere says so, so ``emit`` does not drop them)."""
        return False

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            batch = self._batches.pop(loop, [])
        for thread_id, run_id, type, data in batch:
            self.publish(thread_id, run_id, type, data)

    def attach(self, thread_id: str) -> asyncio.Queue[Event | LiveEvent | BaseException]:
        queue: asyncio.Queue[Event | LiveEvent | BaseException] = asyncio.Queue()
        self._queues.setdefault(thread_id, set()).add(queue)
        return queue

    def detach(self, thread_id: str, queue: asyncio.Queue[Any]) -> None:
        queues = self._queues.get(thread_id)
        if queues is not None:
            queues.discard(queue)
            if not queues:
                del self._queues[thread_id]


async def subscribe(
    store: ThreadStore,
    hub: LiveHub,
    thread_id: str,
    after_seq: int = 0,
    *,
    live: bool = True,
    poll_timeout: float = 5.0,
) -> AsyncIterator[Event | LiveEvent]:
    """Yield the thread's durable events after ``after_seq`` in order, forever, interleaved
    with live events as they happen. A ``ReplayUnavailable`` (events compacted away) is
    raised to the consumer. Closing the iterator releases everything."""
    queue = hub.attach(thread_id) if live else asyncio.Queue()

    async def follow() -> None:
        cursor = after_seq
        try:
            while True:
                events = await store.wait_events(thread_id, cursor, 100, poll_timeout)
                for event in events:
                    queue.put_nowait(event)
                if events:
                    cursor = events[-1].seq
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            queue.put_nowait(exc)

    follower = asyncio.create_task(follow(), name=f"subscribe:{thread_id}")
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        if live:
            hub.detach(thread_id, queue)
