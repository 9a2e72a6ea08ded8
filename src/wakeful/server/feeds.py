"""One follower per streamed thread and server process, shared by every stream client of
that thread.

A ``Feed`` waits for the thread's durable events once (``wait_events``), keeps the most
recent ones in memory (clients that keep up read them from there instead of the store),
caches the states of recent checkpoints (for ``values``), and while some client wants
``messages`` tracks the in-flight assistant message (``wakeful.server.inflight``) from the
live channel and the run's stream checkpoint. Clients wait on ``changed``, which fires at
most once per event-loop turn, and compute what they lack themselves.

Without a live channel the stream checkpoint is polled every ``poll_interval`` seconds while
a run is running; with one, it is read when a gap shows and every ``LIVE_POLL`` seconds (a
safety net for lost live messages). A feed lingers ``linger`` seconds after its last client
so a reconnecting client finds its history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from typing import Any

from wakeful.errors import ReplayUnavailable, WakefulError
from wakeful.fleet.live import LiveChannel, Unsubscribe
from wakeful.records import Event, ThreadSnapshot
from wakeful.runtime.events import LiveEvent
from wakeful.server.inflight import Tracker
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.server.feeds")

RECENT = 512
"""Durable events kept in memory per feed."""
STATES = 32
"""Checkpoint states cached per feed (for ``values``)."""
HISTORY_SCAN = 1000
"""Checkpoints looked through at most to find a ``values`` state by id."""
LIVE_POLL = 1.0
IDLE_WAIT = 5.0
TERMINAL = frozenset(
    ("run.completed", "run.suspended", "run.failed", "run.cancelled", "run.indeterminate")
)


class Feed:
    def __init__(
        self, store: Store, thread_id: str, live: LiveChannel | None, poll_interval: float
    ) -> None:
        self.store = store
        self.thread_id = thread_id
        self.live = live
        self.poll_interval = poll_interval
        self.seen_seq = 0
        self.snapshot: ThreadSnapshot | None = None
        self.tenant: str | None = None
        self.gone = False
        """The thread was deleted (or taken by another tenant) while followed."""
        self.recent: deque[Event] = deque(maxlen=RECENT)
        self.tracker = Tracker()
        self.clients = 0
        self.message_clients = 0
        self.changed = asyncio.Event()
        self._fire_scheduled = False
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Unsubscribe | None = None
        self._states: OrderedDict[str, Any] = OrderedDict()
        self._loading: dict[str, asyncio.Future[tuple[bool, Any]]] = {}
        self._last_poll = 0.0
        self._last_checkpoint = 0.0
        self.linger: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        snap = await self.store.read(self.thread_id)
        self.snapshot = snap
        self.tenant = snap.tenant if snap is not None else None
        self.seen_seq = snap.last_seq if snap is not None else 0
        self._task = asyncio.create_task(self._follow(), name=f"feed:{self.thread_id}")

    async def want_messages(self) -> None:
        self.message_clients += 1
        if self.live is not None and self._unsubscribe is None:
            try:
                self._unsubscribe = await self.live.subscribe(self.thread_id, self._on_live)
            except Exception as exc:  # no live channel now: the checkpoint still serves
                log.warning("live channel unavailable for %s: %s", self.thread_id, exc)
        self._kick.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._unsubscribe is not None:
            with contextlib.suppress(Exception):
                await self._unsubscribe()
            self._unsubscribe = None
        self.gone = True
        self._fire()

    # ---------------------------------------------------------------- notification

    def _notify(self) -> None:
        if not self._fire_scheduled:
            self._fire_scheduled = True
            asyncio.get_running_loop().call_soon(self._fire)

    def _fire(self) -> None:
        self._fire_scheduled = False
        fired, self.changed = self.changed, asyncio.Event()
        fired.set()

    def _on_live(self, event: LiveEvent) -> None:
        if self.message_clients <= 0:
            return
        gap_before = self.tracker.needs_checkpoint
        if self.tracker.on_live(event):
            self._notify()
        if self.tracker.needs_checkpoint and not gap_before:
            self._kick.set()  # read the checkpoint now rather than at the next poll

    # ---------------------------------------------------------------- reads for clients

    def events_after(self, after: int, limit: int) -> list[Event] | None:
        """Events after ``after`` from memory, or ``None`` when memory does not reach back."""
        if not self.recent or self.recent[0].seq > after + 1:
            return None
        return [e for e in self.recent if e.seq > after][:limit]

    async def state_at(self, checkpoint_id: str) -> tuple[bool, Any]:
        """``(True, state)`` of the thread's checkpoint ``checkpoint_id``; ``(False, None)``
        when retention removed it. One store read for all the clients asking at once."""
        if checkpoint_id in self._states:
            return True, self._states[checkpoint_id]
        loading = self._loading.get(checkpoint_id)
        if loading is None:
            loading = asyncio.ensure_future(self._load_state(checkpoint_id))
            self._loading[checkpoint_id] = loading
            loading.add_done_callback(lambda _f: self._loading.pop(checkpoint_id, None))
        return await asyncio.shield(loading)

    async def _load_state(self, checkpoint_id: str) -> tuple[bool, Any]:
        before: str | None = None
        scanned = 0
        while scanned < HISTORY_SCAN:
            page = await self.store.checkpoints(self.thread_id, before=before, limit=100)
            for cp, _at in page:
                self._remember(cp.id, cp.state)
                if cp.id == checkpoint_id:
                    return True, cp.state
            scanned += len(page)
            if len(page) < 100:
                break
            before = page[-1][0].id
        return False, None

    def _remember(self, checkpoint_id: str, state: Any) -> None:
        self._states[checkpoint_id] = state
        self._states.move_to_end(checkpoint_id)
        while len(self._states) > STATES:
            self._states.popitem(last=False)

    # ---------------------------------------------------------------- following

    def _running_run(self) -> str | None:
        cp = self.snapshot.checkpoint if self.snapshot is not None else None
        return cp.run_id if cp is not None and cp.status == "running" else None

    def _in_flight(self, task_id: str | None) -> bool:
        snap = self.snapshot
        if snap is None or snap.checkpoint is None or task_id is None:
            return False
        frontier = {e.get("id") for e in snap.checkpoint.frontier if isinstance(e, dict)}
        return task_id in frontier and task_id not in {w.task_id for w in snap.writes}

    def _timeout(self) -> float:
        if self.message_clients <= 0 or self._running_run() is None:
            return IDLE_WAIT
        if self.live is None or self.tracker.needs_checkpoint:
            return self.poll_interval
        return LIVE_POLL

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                events = await self._wait(self._timeout())
                if events:
                    self._absorb(events)
                if events or loop.time() - self._last_poll >= IDLE_WAIT:
                    await self._refresh()
                if self.gone:
                    self._fire()
                    return
                await self._poll_checkpoint(loop.time())
            except asyncio.CancelledError:
                raise
            except ReplayUnavailable:
                snap = await self.store.read(self.thread_id)
                self.seen_seq = snap.last_seq if snap is not None else 0
                self.recent.clear()
            except WakefulError as exc:
                log.warning("following %s: %s", self.thread_id, exc)
                await asyncio.sleep(self.poll_interval)

    async def _wait(self, timeout: float) -> list[Event]:
        waiting = asyncio.ensure_future(
            self.store.wait_events(self.thread_id, self.seen_seq, 100, timeout)
        )
        kicked = asyncio.ensure_future(self._kick.wait())
        try:
            await asyncio.wait({waiting, kicked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            kicked.cancel()
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
        self._kick.clear()
        if waiting.cancelled():
            return []
        events: list[Event] = waiting.result()
        return events

    def _absorb(self, events: list[Event]) -> None:
        for event in events:
            self.recent.append(event)
            self.seen_seq = event.seq
            data = event.data if isinstance(event.data, dict) else {}
            if event.type == "message.completed" and isinstance(data.get("message_id"), str):
                self.tracker.complete(data["message_id"])
            elif event.type in TERMINAL:
                self.tracker.run_ended(event.run_id)
        self._notify()

    async def _refresh(self) -> None:
        snap = await self.store.read(self.thread_id)
        self._last_poll = asyncio.get_running_loop().time()
        existed = self.snapshot is not None and self.snapshot.version > 0
        if snap is None:
            self.gone = existed  # deleted while followed (a thread not written yet is fine)
            return
        if existed and snap.tenant != self.tenant:
            self.gone = True
            return
        if snap.last_seq < self.seen_seq:  # deleted and written again: numbers restarted
            self.gone = True
            return
        if not existed:
            self.tenant = snap.tenant
        self.snapshot = snap
        if snap.checkpoint is not None:
            self._remember(snap.checkpoint.id, snap.checkpoint.state)

    async def _poll_checkpoint(self, now: float) -> None:
        run_id = self._running_run()
        if self.message_clients <= 0 or run_id is None:
            return
        due = self.live is None or self.tracker.needs_checkpoint
        if not due and now - self._last_checkpoint < LIVE_POLL:
            return
        self._last_checkpoint = now
        try:
            cp = await self.store.stream_checkpoints.get(run_id)
        except WakefulError as exc:
            log.debug("reading the stream checkpoint of %s failed: %s", run_id, exc)
            return
        if cp is None or not self._in_flight(cp.task_id):
            return
        if self.tracker.on_checkpoint(cp, authoritative=self.live is None):
            self._notify()


class Feeds:
    """The feeds of one server: ``acquire`` when a stream starts, ``release`` when it
    ends."""

    def __init__(
        self,
        store: Store,
        live: LiveChannel | None = None,
        *,
        poll_interval: float = 0.025,
        linger: float = 30.0,
    ) -> None:
        self.store = store
        self.live = live
        self.poll_interval = poll_interval
        self.linger = linger
        self._feeds: dict[str, Feed] = {}
        self._starting: dict[str, asyncio.Future[Feed]] = {}

    def __len__(self) -> int:
        return len(self._feeds)

    async def acquire(self, thread_id: str, *, messages: bool) -> Feed:
        feed = self._feeds.get(thread_id)
        if feed is None or feed.gone:
            starting = self._starting.get(thread_id)
            if starting is None:
                starting = asyncio.ensure_future(self._start(thread_id))
                self._starting[thread_id] = starting
                starting.add_done_callback(lambda _f: self._starting.pop(thread_id, None))
            feed = await asyncio.shield(starting)
        feed.clients += 1
        if feed.linger is not None:
            feed.linger.cancel()
            feed.linger = None
        if messages:
            await feed.want_messages()
        return feed

    async def _start(self, thread_id: str) -> Feed:
        old = self._feeds.pop(thread_id, None)
        if old is not None:
            await old.close()
        feed = Feed(self.store, thread_id, self.live, self.poll_interval)
        await feed.start()
        self._feeds[thread_id] = feed
        return feed

    def release(self, feed: Feed, *, messages: bool) -> None:
        feed.clients -= 1
        if messages:
            feed.message_clients -= 1
        if feed.clients > 0:
            return
        loop = asyncio.get_running_loop()
        feed.linger = loop.call_later(self.linger, self._expire, feed)

    def _expire(self, feed: Feed) -> None:
        if feed.clients > 0 or self._feeds.get(feed.thread_id) is not feed:
            return
        del self._feeds[feed.thread_id]
        asyncio.get_running_loop().create_task(feed.close())

    async def close(self) -> None:
        feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            if feed.linger is not None:
                feed.linger.cancel()
            await feed.close()


__all__ = ["Feed", "Feeds"]
