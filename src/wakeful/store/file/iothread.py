"""One dedicated thread that runs a store's blocking log operations, in submission order.

Every write, fsync, truncation, compaction step and reload of the log goes through it, so
they never overlap and never block the event loop. A dedicated thread (rather than the
loop's default executor) keeps this latency-critical path away from unrelated work queued
there.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Then = Callable[[Any], None] | None
_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]", _Then]


class IOThread:
    """Started on first use, stopped by ``stop``; a daemon thread, so a store that is never
    closed does not keep the interpreter alive."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(self, fn: Callable[[], T], then: Callable[[T], None] | None = None) -> T:
        """Run ``fn`` in the thread and return its result (or raise its exception). If the
        awaiting task is cancelled the job still runs to completion; its result is dropped.

        ``then``, if given, is called on the event loop with the result of a successful
        ``fn`` in the very callback that delivers it, before the awaiting task resumes: what
        it wakes (a commit's caller) runs an event-loop iteration sooner. It must not raise."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, loop, future, then))
        return await future

    @property
    def started(self) -> bool:
        return self._thread is not None

    def stop(self) -> None:
        """Let the thread finish the queued jobs and exit; does not wait for it."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, loop, future, then = job
            try:
                result = fn()
            except BaseException as exc:
                _post(loop, _set_exception, future, exc)
            else:
                _post(loop, _set_result, future, result, then)


def _post(loop: asyncio.AbstractEventLoop, setter: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        loop.call_soon_threadsafe(setter, *args)


def _set_result(future: asyncio.Future[Any], result: Any, then: _Then = None) -> None:
    if then is not None:
        then(result)
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
