"""Saver appends to one thread combined into one commit when they arrive together.

LangGraph submits a step's ``put_writes`` and the next step's ``put`` as background tasks in
the same event-loop iteration (the input ``put`` and the first task's writes too), and with
``durability="sync"`` waits only for the ``put``. Committing them one by one costs one
durable write each; an append that arrives while an earlier append of the same thread is
still waiting (for the loop's next iteration, or for the thread's lock while a commit is in
flight) joins it instead, and the batch is one fenced commit of one record.

Every caller is answered only after the commit that holds its items is durable, with its
own failure when its own items could not be built (a value the codec refuses) and with the
commit's failure otherwise: combining changes how many fsyncs a run costs, never what an
acknowledged call guarantees.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

Items = list[dict[str, Any]] | None
"""What one append adds (``None``: nothing, every write it would make is already saved)."""


class Append:
    """One ``put`` or ``put_writes`` call waiting for its batch's commit."""

    __slots__ = ("arg", "build", "done", "run_id", "token")

    def __init__(
        self,
        build: Build,
        arg: Any,
        run_id: Any,
        done: asyncio.Future[None],
        token: int | None = None,
    ) -> None:
        self.build = build
        """``build(index, arg)``: the record items, built from the thread's index when the
        batch is written (a function made once, not a closure per call: a closure and its
        cells are several objects the garbage collector counts, at every append)."""
        self.arg = arg
        self.run_id = run_id
        self.done = done
        self.token = token
        """The claim its caller wrote under (the saver's hold when it was called): a batch
        written under another claim refuses it (the thread changed hands in between)."""


Build = Callable[[Any, Any], Items]

Batch = list[Append]
"""A thread's open batch: the appends that joined it, in order."""


Flush = Callable[[str, str, Callable[[str, Batch], Batch], Batch], Awaitable[None]]
"""``flush(thread, lg_thread, take, batch)``: write one batch. ``take(thread, batch)``,
called once the thread's lock is held, closes the batch to newcomers and returns its
appends; ``flush`` answers every one of them (an exception it raises answers those it did
not)."""


def fail(done: asyncio.Future[None], exc: BaseException) -> None:
    """Answer an append with ``exc``, retrieved even if its caller was cancelled after the
    answer was set and never looks at it (no "exception was never retrieved" at exit). Only
    a failure gets the callback: a success needs no retrieving, and each callback is one
    more loop callback per append."""
    done.set_exception(exc)
    done.add_done_callback(_retrieve)


def _retrieve(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()


class Appends:
    """Open batches by wakeful thread id, each written by one background task."""

    def __init__(self, flush: Flush) -> None:
        self._flush = flush
        self._open: dict[str, Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._taker = self._take  # bound once, not at every batch

    async def add(
        self,
        thread: str,
        lg_thread: str,
        build: Build,
        arg: Any,
        run_id: Any,
        token: int | None = None,
    ) -> None:
        """Append to ``thread`` and return once the commit holding it is durable.
        ``token``: the claim the caller writes under (``Append.token``)."""
        loop = asyncio.get_running_loop()
        append = Append(build, arg, run_id, loop.create_future(), token)
        batch = self._open.get(thread)
        if batch is not None:
            batch.append(append)
        else:
            batch = self._open[thread] = [append]
            # The batch is written by a task of its own, not by its first caller: a caller
            # cancelled while waiting must not strand the appends that joined it. The task
            # removes itself from ``_tasks`` when it ends (no done callback: one loop
            # callback less per commit).
            task = loop.create_task(self._write(thread, lg_thread, batch))
            self._tasks.add(task)
        # A caller cancelled here cancels only its own future; the batch goes on for the rest.
        await append.done

    async def _write(self, thread: str, lg_thread: str, batch: Batch) -> None:
        try:
            # One loop iteration: what LangGraph submitted with this append joins it.
            await _next_iteration()
            await self._flush(thread, lg_thread, self._taker, batch)
        except BaseException as exc:
            self._close(thread, batch)
            for append in batch:
                if append.done.done():
                    continue
                if isinstance(exc, Exception):
                    fail(append.done, exc)
                else:
                    append.done.cancel()
            if not isinstance(exc, Exception):
                raise
        finally:
            me = asyncio.current_task()
            if me is not None:
                self._tasks.discard(me)

    def _take(self, thread: str, batch: Batch) -> Batch:
        self._close(thread, batch)
        return batch

    def _close(self, thread: str, batch: Batch) -> None:
        if self._open.get(thread) is batch:
            del self._open[thread]


@types.coroutine
def _next_iteration() -> Generator[None, None, None]:
    """``await asyncio.sleep(0)`` in one object: a bare ``yield`` makes the task step again
    in the loop's next iteration (``sleep(0)`` makes two coroutine objects to do this)."""
    yield
