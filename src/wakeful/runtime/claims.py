"""Claim policy and the renewal task that keeps a run's claim alive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from wakeful.errors import InvalidInput, StaleClaim, WakefulError
from wakeful.store.contract import ThreadStore

log = logging.getLogger("wakeful.runtime")

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class ClaimPolicy:
    """``ttl``: how long a claim lasts; ``renew_every``: how often a running run renews it
    (seconds; must be shorter than ``ttl``)."""

    ttl: float = 30.0
    renew_every: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_every < self.ttl:
            raise InvalidInput("claims", "renew_every must be > 0 and shorter than ttl")


class Renewer:
    """Renews one claim every ``renew_every`` seconds until stopped. A ``StaleClaim`` marks
    the run fenced (it stops at its next superstep); other store errors are retried at the
    next tick, since the claim may still be valid."""

    def __init__(
        self,
        store: ThreadStore,
        thread_id: str,
        token: int,
        policy: ClaimPolicy,
        on_fenced: Callable[[BaseException], None],
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._store = store
        self._thread_id = thread_id
        self._token = token
        self._policy = policy
        self._on_fenced = on_fenced
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self.renewals = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"renew:{self._thread_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._sleep(self._policy.renew_every)
            try:
                await self._store.renew(self._thread_id, self._token, self._policy.ttl)
                self.renewals += 1
            except StaleClaim as exc:
                self._on_fenced(exc)
                return
            except WakefulError as exc:
                log.warning("renewing claim on %s failed, will retry: %s", self._thread_id, exc)
