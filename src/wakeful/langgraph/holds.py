"""The claims a saver holds on threads, renewed in the background.

A hold is *explicit* (``WakefulSaver.hold``: kept until the block exits) or *automatic*
(taken by the first write to a thread in ``fencing="auto"``: kept while the thread is used
and released after ``idle_release`` seconds without a saver call on it). A renewal that
meets ``StaleClaim`` marks the hold lost: the thread was taken over, and the next write
through it raises that ``StaleClaim`` instead of writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from wakeful.errors import InvalidState, StaleClaim, WakefulError
from wakeful.records import Claim
from wakeful.store.contract import ThreadStore

log = logging.getLogger("wakeful.langgraph")


def default_holder() -> str:
    """``langgraph-<host>-<pid>-<random>``: names this process in ``ThreadBusy``."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:60] or "host"
    return f"langgraph-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def not_held(lg_thread: str) -> InvalidState:
    return InvalidState(
        "thread",
        lg_thread,
        "not held",
        "this saver runs with fencing='hold': run the graph inside "
        "`async with saver.hold(thread_id)`",
    )


@dataclass(eq=False)
class Hold:
    claim: Claim
    explicit: bool
    last_used: float
    due: float
    """When (loop time) the claim is next renewed."""
    lost: StaleClaim | None = None

    @property
    def token(self) -> int:
        return self.claim.token


class Holds:
    """The saver's holds by wakeful thread id; every method runs on the saver's loop.

    One renewer task serves every hold (not one task each: a run's automatic hold outlives
    the run by ``idle_release``, so at 8 concurrent runs hundreds are alive, and a task, its
    timer and its frames per hold were a third of what a run left for the garbage collector
    to traverse). Holds wait in order of their next renewal; the renewer wakes at the first
    one and renews together every hold due within a tenth of ``renew_every`` (one group of
    store writes, never later than due)."""

    def __init__(
        self, store: ThreadStore, ttl: float, renew_every: float, idle_release: float
    ) -> None:
        if not 0 < renew_every < ttl:
            raise ValueError(f"renew_every ({renew_every}) must be > 0 and below ttl ({ttl})")
        self.store = store
        self.ttl = ttl
        self.renew_every = renew_every
        self.idle_release = idle_release
        self._holds: dict[str, Hold] = {}
        self._queue: OrderedDict[Hold, None] = OrderedDict()
        """Live holds in order of ``due`` (a renewal moves its hold to the end)."""
        self._renewer: asyncio.Task[None] | None = None

    def get(self, thread: str) -> Hold | None:
        return self._holds.get(thread)

    def touch(self, thread: str) -> None:
        hold = self._holds.get(thread)
        if hold is not None:
            hold.last_used = asyncio.get_running_loop().time()

    def start(self, claim: Claim, *, explicit: bool) -> Hold:
        loop = asyncio.get_running_loop()
        now = loop.time()
        hold = Hold(claim=claim, explicit=explicit, last_used=now, due=now + self.renew_every)
        self.forget(claim.thread_id)
        self._holds[claim.thread_id] = hold
        self._queue[hold] = None
        if self._renewer is None or self._renewer.done():
            self._renewer = loop.create_task(self._keep(), name="renew langgraph claims")
        return hold

    def forget(self, thread: str) -> Hold | None:
        """Stop holding ``thread`` without releasing (it was deleted or taken over)."""
        hold = self._holds.pop(thread, None)
        if hold is not None:
            self._queue.pop(hold, None)
        return hold

    async def release(self, thread: str) -> None:
        hold = self.forget(thread)
        if hold is not None and hold.lost is None:
            with contextlib.suppress(WakefulError):
                await self.store.release(thread, hold.token)

    async def release_all(self) -> None:
        for thread in list(self._holds):
            await self.release(thread)
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            first = next(iter(self._queue))
            wait = first.due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            horizon = loop.time() + self.renew_every / 10
            due: list[Hold] = []
            for hold in self._queue:
                if hold.due > horizon:
                    break
                due.append(hold)
            for hold in due:
                # renewed or not, its next turn is a period from now (a failed renewal is
                # tried again then; a claim taken over meanwhile shows as StaleClaim)
                self._queue.move_to_end(hold)
                hold.due = loop.time() + self.renew_every
            await asyncio.gather(*(self._renew(hold, loop.time()) for hold in due))

    async def _renew(self, hold: Hold, now: float) -> None:
        thread = hold.claim.thread_id
        if not hold.explicit and now - hold.last_used >= self.idle_release:
            if self._holds.get(thread) is hold:
                self.forget(thread)
                with contextlib.suppress(WakefulError):
                    await self.store.release(thread, hold.token)
            return
        try:
            hold.claim = await self.store.renew(thread, hold.token, self.ttl)
        except StaleClaim as exc:
            log.warning("claim on thread %r was taken over: %s", thread, exc)
            hold.lost = exc
            self._queue.pop(hold, None)
        except WakefulError as exc:
            log.warning("renewing the claim on thread %r failed: %s", thread, exc)
