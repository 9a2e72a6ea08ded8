"""Durability modes: when a run's commits reach the store.

- ``sync``: every task result and every superstep is committed before the run moves on.
- ``async``: commits go, in order, to one writer task per run through a bounded queue
  (backpressure when it is full); the first failure stops the run at its next superstep.
- ``exit``: intermediate commits are folded into one commit made at the end (or at a
  suspension), still fenced by the claim token.

``commit_now`` is always synchronous (admission, suspension, the end of a run): it drains
what is queued first, so commits reach the store in the order they were made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Literal

import msgspec

from wakeful.background import BackgroundTask, StopSignal
from wakeful.errors import StaleClaim, StoreUnavailable
from wakeful.records import Commit, Receipt
from wakeful.store.contract import ThreadStore
from wakeful.telemetry import StoreCalls

Durability = Literal["sync", "async", "exit"]
DURABILITIES = ("sync", "async", "exit")

RETRIES = 5

log = logging.getLogger("wakeful.runtime")


async def commit_retrying(
    store: ThreadStore, thread_id: str, commit: Commit, calls: StoreCalls | None = None
) -> Receipt:
    """Commit, retrying ``StoreUnavailable`` a bounded number of times. Safe because every
    runtime commit carries an operation id: a retry of an applied commit returns its
    receipt instead of applying it twice. ``calls`` observes each attempt (span, latency).

    A retry can meet ``StaleClaim`` when the claim was taken over in between: the caller
    is fenced either way (the token goes first), but when the store says the operation was
    applied before the claim was lost (``StaleClaim.applied_receipt``) that is logged as a
    warning, and the error keeps the receipt for whoever handles the fenced run."""
    delay = 0.05
    for attempt in range(RETRIES):
        try:
            if calls is None:
                return await store.commit(thread_id, commit)
            return await calls("commit", lambda: store.commit(thread_id, commit), thread_id)
        except StaleClaim as exc:
            applied = exc.applied_receipt
            if applied is not None:
                log.warning(
                    "commit %s on thread %s was applied (version %d, events %s) before the "
                    "claim was lost; the run stops as fenced",
                    commit.operation_id,
                    thread_id,
                    applied.version,
                    list(applied.events),
                    extra={"thread_id": thread_id, "operation_id": commit.operation_id},
                )
            raise
        except StoreUnavailable:
            if attempt == RETRIES - 1 or commit.operation_id is None:
                raise
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


class Writer:
    """The ``sync`` writer, and the base of the others."""

    def __init__(self, store: ThreadStore, thread_id: str, calls: StoreCalls | None = None) -> None:
        self.store = store
        self.thread_id = thread_id
        self.calls = calls
        self.failure: BaseException | None = None

    async def submit(self, commit: Commit) -> None:
        """An intermediate commit (a task result, a superstep)."""
        await self.commit_now(commit)

    async def commit_now(self, commit: Commit) -> Receipt:
        """A synchronous commit, after everything submitted before it."""
        await self.flush()
        try:
            return await commit_retrying(self.store, self.thread_id, commit, self.calls)
        except BaseException as exc:
            self.failure = self.failure or exc
            raise

    async def flush(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def close(self) -> None:
        """Stop background work without committing anything more."""


class AsyncWriter(Writer):
    """Commits in order on one background task, with backpressure (``queue_size``)."""

    def __init__(
        self,
        store: ThreadStore,
        thread_id: str,
        queue_size: int = 64,
        calls: StoreCalls | None = None,
    ) -> None:
        super().__init__(store, thread_id, calls)
        # None: a wake-up from close(), so that a drain waiting for work sees its signal
        self._queue: asyncio.Queue[Commit | None] = asyncio.Queue(maxsize=queue_size)
        self._task = BackgroundTask(f"writer:{thread_id}", self._drain)
        self._task.start()

    async def submit(self, commit: Commit) -> None:
        if self.failure is not None:
            raise self.failure
        await self._queue.put(commit)

    async def _drain(self, signal: StopSignal) -> None:
        while not signal.is_set():
            commit = await self._queue.get()
            try:
                if commit is not None and self.failure is None and not signal.is_set():
                    await commit_retrying(self.store, self.thread_id, commit, self.calls)
            except Exception as exc:
                self.failure = exc
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        await self._queue.join()
        await super().flush()

    async def close(self) -> None:
        """Commit nothing more: a commit in flight is interrupted (or, if the interruption
        is swallowed, ends before the task stops); the stop is bounded (``BackgroundTask``)."""
        self._task.signal.set()
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)
        await self._task.stop(interrupt=True)


class ExitWriter(Writer):
    """Folds intermediate commits into the next synchronous one."""

    def __init__(
        self,
        store: ThreadStore,
        thread_id: str,
        base_checkpoint: str | None,
        calls: StoreCalls | None = None,
    ) -> None:
        super().__init__(store, thread_id, calls)
        self._base = base_checkpoint
        self._held: list[Commit] = []

    async def submit(self, commit: Commit) -> None:
        if self.failure is not None:
            raise self.failure
        self._held.append(commit)

    async def commit_now(self, commit: Commit) -> Receipt:
        held, self._held = self._held, []
        events = tuple(e for c in held for e in c.events) + commit.events
        messages = tuple(m for c in held for m in c.messages) + commit.messages
        outbox = tuple(o for c in held for o in c.outbox) + commit.outbox
        checkpoint = commit.checkpoint
        if checkpoint is not None:
            checkpoint = msgspec.structs.replace(checkpoint, parent=self._base)
        merged = msgspec.structs.replace(
            commit, checkpoint=checkpoint, events=events, messages=messages, outbox=outbox
        )
        receipt = await super().commit_now(merged)
        if checkpoint is not None:
            self._base = checkpoint.id
        return receipt


def make_writer(
    mode: str,
    store: ThreadStore,
    thread_id: str,
    base_checkpoint: str | None,
    calls: StoreCalls | None = None,
) -> Writer:
    if mode == "sync":
        return Writer(store, thread_id, calls)
    if mode == "async":
        return AsyncWriter(store, thread_id, calls=calls)
    if mode == "exit":
        return ExitWriter(store, thread_id, base_checkpoint, calls)
    raise ValueError(f"durability must be one of {DURABILITIES}, got {mode!r}")
