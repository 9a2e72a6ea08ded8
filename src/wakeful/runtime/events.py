"""Subscriptions: durable events from the store (any process, no gap, no duplicate,
resumable from a seq) merged with this process's live events (never stored)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
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
        """Deliver on ``loop``, from any thread: on the loop itself at once (after any batch
        still waiting, in order); from another thread in batches, one loop callback per
        batch (``call_soon_threadsafe`` per event, which wakes the loop through its
        self-pipe, cost about 22 µs a delta). An event for a thread nobody
        subscribes to in this process is dropped at once (unless ``forwards`` it): live
        events are never stored."""
        if not self.wants(thread_id, type):
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop and loop not in self._batches:
            # nothing handed over from a thread is waiting: deliver now, in order with what
            # the run does next (its commits' durable events come after its live ones)
            self.publish(thread_id, run_id, type, data)
            return
        with self._lock:
            batch = self._batches.get(loop)
            if batch is not None:
                batch.append((thread_id, run_id, type, data))
                return
            self._batches[loop] = [(thread_id, run_id, type, data)]
        try:
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


def subscribe(
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
    raised to the consumer. Closing the iterator releases everything.

    The live subscription is attached when this returns, not at the first iteration: a
    caller that subscribes and then starts a run receives every live event the run emits,
    however soon (``aclose()`` detaches it, also when never iterated)."""
    queue: asyncio.Queue[Event | LiveEvent | BaseException] = (
        hub.attach(thread_id) if live else asyncio.Queue()
    )
    return _Subscription(
        _follow(store, hub, thread_id, after_seq, queue, live, poll_timeout),
        hub,
        thread_id,
        queue if live else None,
    )


class _Subscription:
    """``subscribe``'s iterator: its generator, and the live queue it attached."""

    __slots__ = ("_gen", "_hub", "_queue", "_thread_id")

    def __init__(
        self,
        gen: AsyncGenerator[Event | LiveEvent, None],
        hub: LiveHub,
        thread_id: str,
        queue: asyncio.Queue[Any] | None,
    ) -> None:
        self._gen = gen
        self._hub = hub
        self._thread_id = thread_id
        self._queue = queue

    def __aiter__(self) -> _Subscription:
        return self

    def __anext__(self) -> Awaitable[Event | LiveEvent]:
        return self._gen.__anext__()

    async def aclose(self) -> None:
        try:
            await self._gen.aclose()
        finally:
            self._detach()

    def _detach(self) -> None:
        if self._queue is not None:
            self._hub.detach(self._thread_id, self._queue)
            self._queue = None

    def __del__(self) -> None:
        # never iterated nor closed: the generator's own ``finally`` never runs
        self._detach()


async def _follow(
    store: ThreadStore,
    hub: LiveHub,
    thread_id: str,
    after_seq: int,
    queue: asyncio.Queue[Event | LiveEvent | BaseException],
    live: bool,
    poll_timeout: float,
) -> AsyncGenerator[Event | LiveEvent, None]:
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
