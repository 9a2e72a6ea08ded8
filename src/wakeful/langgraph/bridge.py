"""Synchronous calls into a saver whose store lives on an event loop.

A wakeful store is async and bound to the loop it was opened on. The saver's sync methods
(what LangGraph's ``graph.invoke`` calls, possibly from its worker threads) submit the
async method to that loop and wait. ``LoopThread`` gives sync programs a loop of their own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from wakeful.errors import InvalidState

T = TypeVar("T")


def call_on(loop: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` from another thread and return its result."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or loop.is_closed() or not loop.is_running():
        coro.close()
        raise InvalidState(
            "saver",
            "WakefulSaver",
            "not bound to a running event loop",
            "use it from synchronous code through WakefulSaver.from_url_sync(...), or call "
            "its async methods (aget_tuple, aput, ...) on the loop its store was opened on",
        )
    if running is loop:
        coro.close()
        raise InvalidState(
            "saver",
            "WakefulSaver",
            "called synchronously on its own event loop",
            "waiting there would block the loop forever; use the async method (ainvoke with "
            "aget_tuple, aput, ...) or run the synchronous graph in a thread",
        )
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class LoopThread:
    """An event loop running in a daemon thread, for synchronous programs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="wakeful-langgraph", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        async def cancel_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self.call(cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
