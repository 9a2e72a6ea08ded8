"""Wake signals: hints that new work may be waiting.

A wake is never needed for correctness: a worker still polls the queue at a floor interval,
so a lost wake only adds latency and a duplicated one only causes another (empty) drain.

Two helpers keep a wake's network out of the way of the work it hints at:

- ``HintSender``: a network wake's ``notify()`` hands the hint to a background send and
  waits for it at most ``NOTIFY_BOUND`` seconds, so a submit never blocks on a frozen or
  unreachable server for longer than that.
- ``WakeWaiter``: a worker's wait on its wake plus its own signals to itself (a slot freed
  up, a stop), which end the wait locally and never go through the network."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from wakeful.background import BackgroundTask, StopSignal

log = logging.getLogger("wakeful.fleet.wake")

NOTIFY_BOUND = 0.25
"""Seconds a network wake's ``notify()`` waits for its hint to be sent. A send still running
then goes on in the background (bounded by the wake's own send timeout): the caller is not
held by a frozen, slow or unreachable server."""

SEND_STOP_TIMEOUT = 1.0
"""Seconds ``HintSender.close`` waits for a send in progress (and again after cancelling it)."""


@runtime_checkable
class Wake(Protocol):
    async def notify(self) -> None:
        """Tell waiting workers (here or elsewhere) that work may be available."""
        ...

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification; True if one arrived."""
        ...

    async def close(self) -> None: ...


class LocalWake:
    """Wakes workers in this process (one event loop)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    async def notify(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return False
        self._event.clear()
        return True

    async def close(self) -> None:
        self._event.set()


class NoWake:
    """Polling only."""

    async def notify(self) -> None:
        return None

    async def wait(self, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    async def close(self) -> None:
        return None


def _resolve(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


class HintSender:
    """Runs a wake's ``send()`` in one background task for every ``notify()``.

    ``notify()`` never raises and returns once its hint was sent or after ``bound`` seconds,
    whichever comes first. Notifies that arrive while a send runs share the next send (a
    burst coalesces, as the waiting side does anyway), so a notify is always followed by a
    send that starts after it. ``send`` must bound itself (a timeout) and may raise: a
    failure is logged and the hint dropped (workers still poll). ``close()`` lets a send in
    progress end (up to ``SEND_STOP_TIMEOUT`` seconds, then cancels it); hints not yet
    sent are dropped."""

    def __init__(
        self,
        name: str,
        send: Callable[[], Awaitable[None]],
        *,
        bound: float = NOTIFY_BOUND,
        logger: logging.Logger | None = None,
    ) -> None:
        self.name = name
        self.bound = bound
        self._send = send
        self._log = logger or log
        self._waiting: list[asyncio.Future[None]] = []
        self._task: BackgroundTask | None = None
        self._closed = False
        self.sends = 0
        """Sends started (for tests and metrics)."""

    async def notify(self) -> None:
        if self._closed:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if self._task is None or not self._task.running:
            self._task = BackgroundTask(self.name, self._run, logger=self._log)
            self._task.start()
        await asyncio.wait({waiter}, timeout=self.bound)

    async def _run(self, signal: StopSignal) -> None:
        while self._waiting and not signal.is_set():
            batch, self._waiting = self._waiting, []
            self.sends += 1
            try:
                await self._send()
            except Exception as exc:
                self._log.warning(
                    "%s: the wake could not be sent and is dropped (workers still poll): %s: %s",
                    self.name,
                    type(exc).__name__,
                    exc,
                )
            finally:
                _resolve(batch)

    async def close(self) -> None:
        """Stop sending; idempotent."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            await task.stop(SEND_STOP_TIMEOUT)
        waiting, self._waiting = self._waiting, []
        _resolve(waiting)


class WakeWaiter:
    """One worker's wait: its ``Wake`` or its own ``nudge()``, whichever comes first.

    A nudge (a slot freed up, a stop) is local: it ends the wait in progress, or the next,
    at once, whatever the wake's network does. A wake wait that a nudge cut short is not
    abandoned: it stays pending and is the next ``wait``'s (a ``Wake`` serves one waiter at
    a time), so no notification is lost, no two waits run at once, and the queue is still
    polled at least every ``timeout`` seconds."""

    def __init__(self, wake: Wake) -> None:
        self.wake = wake
        self._nudged = False
        self._waiter: asyncio.Future[None] | None = None
        """The wait in progress's future, resolved by a nudge (a future, not a task
        waiting on an event: a worker waits once per claim)."""
        self._pending: asyncio.Task[bool] | None = None

    def nudge(self) -> None:
        """End the wait in progress (or the next) now."""
        self._nudged = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _take_nudge(self) -> bool:
        nudged, self._nudged = self._nudged, False
        return nudged

    async def wait(self, timeout: float) -> bool:
        """True when nudged or notified within ``timeout`` seconds (or since the last wait);
        False when the wait timed out."""
        if self._take_nudge():
            return True
        if self._pending is None:
            self._pending = asyncio.ensure_future(self.wake.wait(timeout))
        self._waiter = nudged = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait({self._pending, nudged}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiter = None
            nudged.cancel()
        if self._take_nudge():
            return True
        pending, self._pending = self._pending, None
        return pending.result() if pending.done() else False

    async def close(self, timeout: float = SEND_STOP_TIMEOUT) -> None:
        """End a wake wait still pending (cancelled; waited for at most ``timeout``)."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending}, timeout=timeout)
        if pending is not None and pending.done() and not pending.cancelled():
            pending.exception()  # retrieved: a wait that failed was already logged by it


__all__ = [
    "NOTIFY_BOUND",
    "HintSender",
    "LocalWake",
    "NoWake",
    "Wake",
    "WakeWaiter",
]
