"""Claim policy, a run's signs of life, and the renewal task that keeps its claim alive
while the run is alive.

A renewal is sent only while the run makes progress or is known to be waiting (a model
stream, a tool call, a sleep: ``Progress``). A run that shows neither for ``stall_after``
seconds is stuck: its renewer stops renewing and reports it (``on_stalled``), so the claim
expires and another worker takes the run over.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from wakeful.background import BackgroundTask, StopSignal
from wakeful.errors import InvalidInput, StaleClaim, WakefulError
from wakeful.store.contract import ThreadStore

log = logging.getLogger("wakeful.runtime")

Sleep = Callable[[float], Awaitable[None]]

RENEW_SLOTS = 40
"""Renewal times are rounded up to a grid of this many slots per ``renew_every`` (0.25 s
for the default 10 s): a renewal is at most a slot late, far inside the claim's ``ttl``."""


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

    def wait(self) -> _Waiting:
        """``with progress.wait(): ...``: the run is known to be waiting (on a model, a
        tool, a sleep) for the block."""
        return _Waiting(self)


class _Waiting:
    """The block of ``Progress.wait``. A class, not a generator's context manager: a
    streaming run sits in one for its whole model call, and a thousand of them held a
    generator frame each (about 400 B a run, issue 24)."""

    __slots__ = ("_progress",)

    def __init__(self, progress: Progress) -> None:
        self._progress = progress

    def __enter__(self) -> None:
        progress = self._progress
        progress._waits += 1
        progress.steps += 1

    def __exit__(self, *exc: object) -> None:
        progress = self._progress
        progress._waits -= 1
        progress.steps += 1


class _Grid:
    """One event loop's renewal timers: one timer per instant of the renewal grid, shared by
    every renewer due then (a worker starts and ends hundreds of runs a second, and most end
    before their first renewal: a timer of their own each, made and cancelled, cost the
    loop's timer heap a push and a purge per run)."""

    __slots__ = ("due",)

    def __init__(self) -> None:
        self.due: dict[float, tuple[asyncio.TimerHandle, dict[Renewer, float]]] = {}

    def add(
        self, loop: asyncio.AbstractEventLoop, when: float, renewer: Renewer, interval: float
    ) -> asyncio.TimerHandle:
        """Call ``renewer._due(interval)`` at ``when``; the timer it shares."""
        slot = self.due.get(when)
        if slot is None:
            slot = self.due[when] = (loop.call_at(when, self._fire, when), {})
        slot[1][renewer] = interval
        return slot[0]

    def remove(self, when: float, renewer: Renewer) -> None:
        slot = self.due.get(when)
        if slot is not None:
            slot[1].pop(renewer, None)

    def _fire(self, when: float) -> None:
        _, renewers = self.due.pop(when)
        for renewer, interval in renewers.items():
            renewer._due(interval)


_GRIDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Grid] = weakref.WeakKeyDictionary()


def _grid(loop: asyncio.AbstractEventLoop) -> _Grid | None:
    """The loop's grid; None for a loop that cannot be weakly referenced (its renewers then
    keep a timer each)."""
    try:
        grid = _GRIDS.get(loop)
        if grid is None:
            grid = _GRIDS[loop] = _Grid()
    except TypeError:
        return None
    return grid


def _ignore(_cause: BaseException) -> None:
    """A stopped renewer's ``on_fenced``."""


class Renewer:
    """Renews one claim every ``renew_every`` seconds while its run shows life, until
    stopped. A ``StaleClaim`` marks the run fenced (it stops at its next superstep); other
    store errors are retried at the next tick, since the claim may still be valid.

    With the default sleep the waits between renewals are event-loop timers and a renewal
    runs as a short ``BackgroundTask`` of its own: a worker's thousand runs hold no renewal
    task (with its coroutines, future and context: about 1.3 KB a run) through the ten
    seconds between two renewals. With another ``sleep`` (a test's controllable one) one
    ``BackgroundTask`` loops through it.

    ``stop()`` ends the renewal in flight by its own signal (see ``wakeful.background``):
    once it has returned, no renewal is sent (unless the task had to be abandoned, which is
    logged; a renewal it still sends is refused by the store once the run's ending commit
    has ended the claim)."""

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
        self._task: BackgroundTask | None = None
        self._timer: asyncio.TimerHandle | None = None
        """The (shared) timer of the next renewal, while one is armed."""
        self._armed: tuple[_Grid, float] | None = None
        self._stopped = False
        self._seen = -1  # the run's start is progress: the first interval never counts as idle
        self._idle = 0.0
        self.renewals = 0
        self.stalled = False

    def start(self) -> None:
        # The first interval is a random part of the period, so that runs started together
        # (a worker's batch of leases) spread their renewals over it instead of renewing in
        # the same instant every period; later intervals are exact.
        first = self._policy.renew_every * random.uniform(0.5, 1.0)
        if self._sleep is asyncio.sleep:
            self._arm(first)
        else:
            self._task = self._background(functools.partial(self._run, first))

    async def stop(self) -> None:
        """Stop renewing: returns once no renewal is in flight (bounded by twice the
        policy's ``stop_timeout``). A stopped renewer calls back nothing and lets go of
        its callbacks (bound methods of its run, which holds it): the finished run is then
        freed by reference counting, not left as a cycle for the garbage collector."""
        self._stopped = True
        if self._armed is not None:  # a shared timer: only this renewer leaves it
            grid, when = self._armed
            grid.remove(when, self)
        elif self._timer is not None:
            self._timer.cancel()
        self._armed = self._timer = None
        if self._task is not None:
            await self._task.stop()
        self._on_fenced = _ignore
        self._on_stalled = None

    def _background(self, body: Callable[[StopSignal], Awaitable[None]]) -> BackgroundTask:
        task = BackgroundTask(
            f"renew:{self._thread_id}", body, stop_timeout=self._policy.stop_timeout, logger=log
        )
        task.start()
        return task

    def _due(self, interval: float) -> None:
        """The timer fired: one renewal, in a task of its own."""
        self._armed = self._timer = None
        if not self._stopped:
            self._task = self._background(functools.partial(self._once, interval))

    async def _once(self, interval: float, signal: StopSignal) -> None:
        if await self._tick(interval, signal) and not (signal.is_set() or self._stopped):
            self._arm(self._policy.renew_every)

    def _arm(self, interval: float) -> None:
        """The timer for the next renewal, ``interval`` seconds from now rounded up to the
        renewal grid (``RENEW_SLOTS`` slots a period): the renewals of many runs due within
        one slot fire in the same event-loop iteration and reach the store together (one
        grouped statement on PostgreSQL instead of one each), still spread over the
        period."""
        loop = asyncio.get_running_loop()
        step = self._policy.renew_every / RENEW_SLOTS
        when = math.ceil((loop.time() + interval) / step) * step
        grid = _grid(loop)
        if grid is None:
            self._timer = loop.call_at(when, self._due, interval)
            return
        self._timer = grid.add(loop, when, self, interval)
        self._armed = (grid, when)

    async def _run(self, interval: float, signal: StopSignal) -> None:
        while True:
            if await signal.pause(interval, self._sleep):
                return
            if not await self._tick(interval, signal):
                return
            interval = self._policy.renew_every

    async def _tick(self, interval: float, signal: StopSignal) -> bool:
        """One renewal, ``interval`` seconds after the last; False when renewing is over
        (stopped, stalled or fenced)."""
        if signal.is_set():
            return False
        progress = self._progress
        if progress is not None and self._policy.stall_after is not None:
            if progress.waiting or progress.steps != self._seen:
                self._seen, self._idle = progress.steps, 0.0
            else:
                self._idle += interval
                if self._idle >= self._policy.stall_after:
                    self.stalled = True
                    if self._on_stalled is not None:
                        await self._on_stalled(self._idle)
                    return False
        try:
            await self._store.renew(self._thread_id, self._token, self._policy.ttl)
            self.renewals += 1
        except StaleClaim as exc:
            self._on_fenced(exc)
            return False
        except WakefulError as exc:
            log.warning("renewing claim on %s failed, will retry: %s", self._thread_id, exc)
        return True
