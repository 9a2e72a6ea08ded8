"""Claim policy, a run's signs of life, and the renewal task that keeps its claim alive
while the run is alive.

A renewal is sent only while the run makes progress or is known to be waiting (a model
stream, a tool call, a sleep: ``Progress``). A run that shows neither for ``stall_after``
seconds is stuck: its renewer stops renewing and reports it (``on_stalled``), so the claim
expires and another worker takes the run over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from wakeful.background import BackgroundTask, StopSignal
from wakeful.errors import InvalidInput, StaleClaim, WakefulError
from wakeful.store.contract import ThreadStore

log = logging.getLogger("wakeful.runtime")

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class ClaimPolicy:
    """``ttl``: how long a claim lasts; ``renew_every``: how often a running run renews it
    (seconds; must be shorter than ``ttl``).

    ``stall_after``: seconds a run may go without progress (a commit, a task starting or
    ending, ``NodeContext.progress()``) while not known to be waiting (``NodeContext.waiting``:
    a model stream, a tool call, a retry's sleep) before its claim stops being renewed and
    another worker takes it over; ``None`` renews for as long as the run runs. Counted in
    renewal intervals, so it is at least ``renew_every``.

    ``stop_timeout``: seconds the end of a run waits for a renewal in flight before cancelling
    it, and again before abandoning it (with a warning)."""

    ttl: float = 30.0
    renew_every: float = 10.0
    stall_after: float | None = 300.0
    stop_timeout: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_every < self.ttl:
            raise InvalidInput("claims", "renew_every must be > 0 and shorter than ttl")
        if self.stall_after is not None and not self.stall_after >= self.renew_every:
            raise InvalidInput("claims", "stall_after must be None or at least renew_every")
        if not self.stop_timeout > 0:
            raise InvalidInput("claims", "stop_timeout must be > 0")


class Progress:
    """A run's signs of life, read by its renewer: a counter that moves with progress, and
    how many waits the run has declared that are in progress."""

    __slots__ = ("_waits", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self._waits = 0

    def moved(self) -> None:
        """The run made progress."""
        self.steps += 1

    @property
    def waiting(self) -> bool:
        return self._waits > 0

    @contextlib.contextmanager
    def wait(self) -> Iterator[None]:
        """The run is known to be waiting (on a model, a tool, a sleep) for the block."""
        self._waits += 1
        self.steps += 1
        try:
            yield
        finally:
            self._waits -= 1
            self.steps += 1


class Renewer:
    """Renews one claim every ``renew_every`` seconds while its run shows life, until
    stopped. A ``StaleClaim`` marks the run fenced (it stops at its next superstep); other
    store errors are retried at the next tick, since the claim may still be valid.

    ``stop()`` ends the task by its own signal (see ``wakeful.background``): once it has
    returned, no renewal is sent (unless the task had to be abandoned, which is logged; a
    renewal it still sends is refused by the store once the run's ending commit has ended
    the claim).

    With the event loop's own sleep, the task is not created until its first interval has
    passed (one timer until then): most runs end well within it, and a task per run (its
    creation, first step, waiter and the wait for it at ``stop()``) was a measurable part of
    a worker's CPU per short dispatch (decision 0022, "Worker CPU")."""

    def __init__(
        self,
        store: ThreadStore,
        thread_id: str,
        token: int,
        policy: ClaimPolicy,
        on_fenced: Callable[[BaseException], None],
        sleep: Sleep = asyncio.sleep,
        progress: Progress | None = None,
        on_stalled: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._thread_id = thread_id
        self._token = token
        self._policy = policy
        self._on_fenced = on_fenced
        self._sleep = sleep
        self._progress = progress
        self._on_stalled = on_stalled
        self._task = BackgroundTask(
            f"renew:{thread_id}", self._run, stop_timeout=policy.stop_timeout, logger=log
        )
        self.renewals = 0
        self.stalled = False
        # The first interval is a random part of the period, so that runs started together
        # (a worker's batch of leases) spread their renewals over it instead of renewing in
        # the same instant every period; later intervals are exact.
        self._first = policy.renew_every * random.uniform(0.5, 1.0)
        self._deferred: asyncio.TimerHandle | None = None
        """The timer that starts the task after the first interval (the loop's own sleep)."""

    def start(self) -> None:
        if self._sleep is asyncio.sleep:
            loop = asyncio.get_running_loop()
            self._deferred = loop.call_later(self._first, self._begin)
        else:  # a caller's sleep (a test's clock) paces even the first interval
            self._task.start()

    def _begin(self) -> None:
        self._deferred = None
        self._first = 0.0  # waited for by the timer
        self._task.start()  # never after stop(): a stopped task does not start

    async def stop(self) -> None:
        """Stop renewing: returns once no renewal is in flight (bounded by twice the
        policy's ``stop_timeout``)."""
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        await self._task.stop()

    async def _run(self, signal: StopSignal) -> None:
        progress = self._progress
        seen = -1  # the run's start is progress: the first interval never counts as idle
        idle = 0.0
        interval = self._first
        while True:
            if interval > 0 and await signal.pause(interval, self._sleep):
                return
            if signal.is_set():
                return
            if progress is not None and self._policy.stall_after is not None:
                if progress.waiting or progress.steps != seen:
                    seen, idle = progress.steps, 0.0
                else:
                    idle += interval
                    if idle >= self._policy.stall_after:
                        self.stalled = True
                        if self._on_stalled is not None:
                            await self._on_stalled(idle)
                        return
            interval = self._policy.renew_every
            try:
                await self._store.renew(self._thread_id, self._token, self._policy.ttl)
                self.renewals += 1
            except StaleClaim as exc:
                self._on_fenced(exc)
                return
            except WakefulError as exc:
                log.warning("renewing claim on %s failed, will retry: %s", self._thread_id, exc)
