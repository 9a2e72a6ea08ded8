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
from dataclasses import dataclass, field

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


@dataclass
class Hold:
    claim: Claim
    explicit: bool
    last_used: float
    lost: StaleClaim | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def token(self) -> int:
        return self.claim.token


class Holds:
    """The saver's holds by wakeful thread id; every method runs on the saver's loop."""

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

    def get(self, thread: str) -> Hold | None:
        return self._holds.get(thread)

    def touch(self, thread: str) -> None:
        hold = self._holds.get(thread)
        if hold is not None:
            hold.last_used = asyncio.get_running_loop().time()

    def start(self, claim: Claim, *, explicit: bool) -> Hold:
        loop = asyncio.get_running_loop()
        hold = Hold(claim=claim, explicit=explicit, last_used=loop.time())
        hold.task = loop.create_task(self._keep(hold), name=f"renew {claim.thread_id}")
        self._holds[claim.thread_id] = hold
        return hold

    def forget(self, thread: str) -> Hold | None:
        """Stop holding ``thread`` without releasing (it was deleted or taken over)."""
        hold = self._holds.pop(thread, None)
        if hold is not None and hold.task is not None:
            hold.task.cancel()
        return hold

    async def release(self, thread: str) -> None:
        hold = self.forget(thread)
        if hold is not None and hold.lost is None:
            with contextlib.suppress(WakefulError):
                await self.store.release(thread, hold.token)

    async def release_all(self) -> None:
        for thread in list(self._holds):
            await self.release(thread)

    async def _keep(self, hold: Hold) -> None:
        thread = hold.claim.thread_id
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.renew_every)
            if not hold.explicit and loop.time() - hold.last_used >= self.idle_release:
                if self._holds.get(thread) is hold:
                    self._holds.pop(thread)
                    with contextlib.suppress(WakefulError):
                        await self.store.release(thread, hold.token)
                return
            try:
                hold.claim = await self.store.renew(thread, hold.token, self.ttl)
            except StaleClaim as exc:
                log.warning("claim on thread %r was taken over: %s", thread, exc)
                hold.lost = exc
                return
            except WakefulError as exc:
                # The next tick tries again; a claim taken over meanwhile shows as StaleClaim.
                log.warning("renewing the claim on thread %r failed: %s", thread, exc)
