"""Background tasks that stop on their own signal, in bounded time.

Cancellation alone cannot stop a loop reliably: code below it may swallow a cancellation.
On Python 3.11, ``asyncio.wait_for`` returns its inner result when a cancel arrives in the
event-loop iterations between the inner wait completing and ``wait_for`` returning;
psycopg_pool waits for a connection that way, so a task cancelled just as the pool hands
it a connection goes on as if nothing happened (psycopg issue 1345). A loop that only
``task.cancel()`` stops then runs for ever, and whoever awaits it hangs with it.

So every long-lived task wakeful owns is a ``BackgroundTask``:

- its body takes a ``StopSignal``, checks it between steps and waits through it
  (``signal.pause``), so it ends after its current step once the signal is set, whatever
  happens to a cancellation;
- ``stop()`` sets the signal and waits for the body to end; after ``timeout`` seconds it
  cancels the task (to interrupt a step that blocks) and waits ``timeout`` more; a task
  still running then is abandoned with one warning naming it. ``stop()`` never waits
  longer than twice its timeout and never raises what the body raised (that is logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("wakeful.background")

Sleep = Callable[[float], Awaitable[None]]

STOP_TIMEOUT = 5.0
"""Seconds ``BackgroundTask.stop`` waits for the body to end its current step before it
cancels the task, and again after cancelling before it abandons the task."""


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _discard(waiters: list[asyncio.Future[None]], waiter: asyncio.Future[None]) -> None:
    with contextlib.suppress(ValueError):  # set() or wake() took the list
        waiters.remove(waiter)


class StopSignal:
    """A one-way flag a loop checks between its steps and waits through."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        # a list: one or two waiters at a time (a set costs 216 bytes, for every run's
        # renewer and stream saver)
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Raise the flag and end every ``pause`` and ``wait`` in progress."""
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _resolve(waiter)

    async def wait(self) -> None:
        """Return once the signal is set."""
        while not await self.idle():
            pass

    async def idle(self) -> bool:
        """Wait until the signal is set or ``wake`` is called (a producer telling the loop
        there is work); True when the signal is set. One future, no task, no timer."""
        if self._set:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            _discard(self._waiters, waiter)
        return self._set

    def wake(self) -> None:
        """End the ``idle`` waits in progress without setting the signal (a ``pause`` in
        progress returns early too, with False)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _resolve(waiter)

    async def pause(self, seconds: float, sleep: Sleep | None = None) -> bool:
        """Wait ``seconds`` (through ``sleep`` when given, e.g. a test's controllable sleep)
        or until the signal is set, whichever comes first. True when the signal is set: the
        loop should end. A plain wait costs one timer, no task."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            if sleep is None or sleep is asyncio.sleep:
                timer = loop.call_later(max(seconds, 0.0), _resolve, waiter)
                try:
                    await waiter
                finally:
                    timer.cancel()
            else:
                sleeper = asyncio.ensure_future(sleep(seconds))
                try:
                    await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not sleeper.done():
                        sleeper.cancel()
                if sleeper.done() and not sleeper.cancelled():
                    sleeper.result()  # a sleep that failed fails the loop
        finally:
            _discard(self._waiters, waiter)
        return self._set


class BackgroundTask:
    """One task running ``body(signal)`` until the body returns or ``stop()``.

    The body must check ``signal`` between its steps (or wait through ``signal.pause``) and
    return once it is set. An exception the body raises ends the task and is logged."""

    def __init__(
        self,
        name: str,
        body: Callable[[StopSignal], Awaitable[None]],
        *,
        stop_timeout: float = STOP_TIMEOUT,
        logger: logging.Logger | None = None,
    ) -> None:
        self.name = name
        self.signal = StopSignal()
        self.stop_timeout = stop_timeout
        self.abandoned = False
        """``stop()`` had to give up on the task (it is logged)."""
        self._body = body
        self._log = logger or log
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def stopping(self) -> bool:
        return self.signal.is_set()

    def start(self) -> None:
        """Start the task (once; a stopped task is not started again)."""
        if self._task is None and not self.signal.is_set():
            self._task = asyncio.get_running_loop().create_task(self._main(), name=self.name)

    async def _main(self) -> None:
        try:
            await self._body(self.signal)
        except Exception:
            self._log.exception("background task %s failed and stopped", self.name)

    async def stop(self, timeout: float | None = None, *, interrupt: bool = False) -> bool:
        """Set the signal and wait for the task to end (see the module docstring). With
        ``interrupt`` the task is cancelled at once too, for a body that blocks in a wait it
        cannot see the signal from (it still ends by the signal if the cancellation is
        swallowed). True when the task has ended (or never started)."""
        self.signal.set()
        task = self._task
        if task is None or task.done():
            return True
        limit = self.stop_timeout if timeout is None else timeout
        if interrupt:
            task.cancel()
        await asyncio.wait({task}, timeout=limit)
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=limit)
        if not task.done():
            self.abandoned = True
            self._log.warning(
                "background task %s did not stop within %.1f s of being asked to and was "
                "cancelled; abandoning it (it may still finish its current step)",
                self.name,
                2 * limit,
            )
            return False
        return True


async def pause(stop: StopSignal | asyncio.Event, seconds: float) -> bool:
    """``stop.pause(seconds)`` for a ``StopSignal``; the same for an ``asyncio.Event`` (a
    caller's stop flag). True when the flag is set."""
    if isinstance(stop, StopSignal):
        return await stop.pause(seconds)
    if stop.is_set():
        return True
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()
    return stop.is_set()


__all__ = ["STOP_TIMEOUT", "BackgroundTask", "StopSignal", "pause"]
