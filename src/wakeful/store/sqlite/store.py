"""``SqliteStore``: the whole store contract over one SQLite file shared by many processes.

Each method validates its input exactly as the reference store does (before touching
storage), then runs one job: a write job inside one write transaction (see ``connection``),
or a read job inside one read transaction. Claim and lease expiry are judged by the clock
the store was opened with, read inside the write transaction that decides.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from datetime import datetime
from typing import Self, TypeVar

from wakeful.background import BackgroundTask, StopSignal
from wakeful.clock import Clock
from wakeful.errors import (
    InvalidInput,
    StoreClosed,
    StreamCheckpointError,
    WakefulError,
)
from wakeful.ids import check_count, check_id, check_optional_id, check_seconds
from wakeful.records import (
    Branch,
    Checkpoint,
    CheckpointEntry,
    Claim,
    Commit,
    Dispatch,
    DispatchStatus,
    Event,
    InboxMessage,
    Lease,
    Message,
    Outcome,
    PruneReport,
    Receipt,
    RetentionPolicy,
    RunSegment,
    StreamCheckpoint,
    ThreadSnapshot,
    ThreadSummary,
    WorkerIdentity,
    WorkerInfo,
)
from wakeful.store import streamputs
from wakeful.store.kinds import DISPATCH_KINDS
from wakeful.store.pins import check_migration
from wakeful.store.sqlite import branches, messaging, migrate, queue, reads, retention, threads
from wakeful.store.sqlite.connection import Database
from wakeful.store.sqlite.firing import SqliteFiring
from wakeful.store.sqlite.limits import SqliteLimits
from wakeful.store.sqlite.schedules import SqliteSchedules
from wakeful.store.sqlite.waiting import Watcher
from wakeful.store.validate import (
    check_discard,
    check_outcome,
    check_policy,
    check_text,
    check_token,
    encode_claim_and_commit,
    encode_commit,
)
from wakeful.store.validate_queue import (
    check_depth_limit,
    check_dispatch,
    check_listing,
    check_version,
)

T = TypeVar("T")


class SqliteStore(SqliteLimits, SqliteSchedules, SqliteFiring):
    """The store contract over a SQLite database file (open it with ``open_store``)."""

    def __init__(self, db: Database, clock: Clock, poll_interval: float) -> None:
        self._db = db
        self._clock = clock
        self._closed = False
        self._watcher = Watcher(db, poll_interval)
        self._stream = SqliteStreamCheckpoints(self)

    @property
    def url(self) -> str:
        return self._db.url

    @property
    def path(self) -> str:
        return self._db.path

    @property
    def stream_checkpoints(self) -> SqliteStreamCheckpoints:
        return self._stream

    def now(self) -> datetime:
        """The store's clock."""
        return self._clock.now()

    async def _write(self, job: Callable[[sqlite3.Connection, datetime], T]) -> T:
        if self._closed:
            raise StoreClosed()
        clock = self._clock
        # The clock is read inside the transaction: a decision uses the time at which it
        # holds the write lock, not the time the call was queued.
        return await self._db.write(lambda conn: job(conn, clock.now()))

    async def _read(self, job: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreClosed()
        return await self._db.read(job)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stream.close()
        await self._watcher.close()
        await self._db.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ claims

    async def claim(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None = None
    ) -> Claim:
        check_id("thread_id", thread_id)
        check_id("holder", holder)
        ttl = check_seconds("ttl", ttl)
        check_optional_id("tenant", tenant)
        return await self._write(
            lambda c, now: threads.claim(c, now, thread_id, holder, ttl, tenant)
        )

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        check_id("thread_id", thread_id)
        check_token(token)
        ttl = check_seconds("ttl", ttl)
        return await self._write(lambda c, now: threads.renew(c, now, thread_id, token, ttl))

    async def release(self, thread_id: str, token: int) -> None:
        check_id("thread_id", thread_id)
        check_token(token)
        await self._write(lambda c, _: threads.release(c, thread_id, token))

    # ------------------------------------------------------------ commits

    async def commit(self, thread_id: str, commit: Commit) -> Receipt:
        encoded = encode_commit(thread_id, commit)
        receipt = await self._write(lambda c, now: threads.commit(c, now, thread_id, encoded))
        if encoded.commit.events:
            self._watcher.notify(thread_id)
        return receipt

    async def claim_and_commit(
        self, thread_id: str, holder: str, ttl: float, commit: Commit
    ) -> tuple[Claim, Receipt]:
        ttl, encoded = encode_claim_and_commit(thread_id, holder, ttl, commit)
        claim, receipt = await self._write(
            lambda c, now: threads.claim_and_commit(c, now, thread_id, holder, ttl, encoded)
        )
        if encoded.commit.events:
            self._watcher.notify(thread_id)
        return claim, receipt

    # ------------------------------------------------------------ reads

    async def read(self, thread_id: str) -> ThreadSnapshot | None:
        check_id("thread_id", thread_id)
        return await self._read(lambda c: reads.read(c, thread_id))

    async def operation(self, thread_id: str, operation_id: str) -> Receipt | None:
        check_id("thread_id", thread_id)
        check_id("operation_id", operation_id)
        return await self._read(lambda c: reads.operation(c, thread_id, operation_id))

    async def messages(self, thread_id: str, after: int = 0, limit: int = 100) -> list[Message]:
        check_id("thread_id", thread_id)
        after = check_count("after", after, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        return await self._read(lambda c: branches.view(c, thread_id, None, after, limit))

    async def branch_messages(
        self, thread_id: str, branch: int, after: int = 0, limit: int = 100
    ) -> list[Message]:
        check_id("thread_id", thread_id)
        branch = check_count("branch", branch, maximum=2**62)
        after = check_count("after", after, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        return await self._read(lambda c: branches.view(c, thread_id, branch, after, limit))

    async def branches(self, thread_id: str) -> list[Branch]:
        check_id("thread_id", thread_id)
        return await self._read(lambda c: branches.load(c, thread_id)[0])

    async def history(
        self, thread_id: str, before: str | None = None, limit: int = 50
    ) -> list[CheckpointEntry]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        return await self._read(lambda c: branches.history(c, thread_id, before, limit))

    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointEntry | None:
        check_id("thread_id", thread_id)
        check_id("checkpoint_id", checkpoint_id)
        return await self._read(lambda c: branches.get(c, thread_id, checkpoint_id))

    async def events_after(
        self, thread_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[Event]:
        check_id("thread_id", thread_id)
        after_seq = check_count("after_seq", after_seq, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        return await self._read(lambda c: reads.events_after(c, thread_id, after_seq, limit))

    async def wait_events(
        self, thread_id: str, after_seq: int = 0, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        timeout = check_seconds("timeout", timeout, allow_zero=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            found = await self.events_after(thread_id, after_seq, limit)
            remaining = deadline - loop.time()
            if found or remaining <= 0 or self._closed:
                return found
            waiter = self._watcher.register(thread_id, after_seq)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                return await self.events_after(thread_id, after_seq, limit)
            finally:
                self._watcher.forget(thread_id, waiter)

    async def list_threads(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[ThreadSummary]:
        check_optional_id("tenant", tenant)
        check_optional_id("after", after)
        limit = check_count("limit", limit, minimum=1)
        return await self._read(lambda c: reads.list_threads(c, tenant, after, limit))

    async def checkpoints(
        self, thread_id: str, before: str | None = None, limit: int = 100
    ) -> list[tuple[Checkpoint, datetime]]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        return await self._read(lambda c: reads.checkpoints(c, thread_id, before, limit))

    async def runs(
        self, thread_id: str, before: str | None = None, limit: int = 20
    ) -> list[RunSegment]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        return await self._read(lambda c: reads.runs(c, thread_id, before, limit))

    # ------------------------------------------------------------ maintenance

    async def compact_events(self, thread_id: str, before_seq: int) -> int:
        check_id("thread_id", thread_id)
        before_seq = check_count("before_seq", before_seq, maximum=2**62)
        return await self._write(lambda c, _: threads.compact_events(c, thread_id, before_seq))

    async def delete_thread(self, thread_id: str) -> None:
        check_id("thread_id", thread_id)
        if await self._write(lambda c, _: threads.delete_thread(c, thread_id)):
            self._watcher.notify(thread_id)

    async def prune(self, policy: RetentionPolicy) -> PruneReport:
        check_policy(policy)
        if self._closed:
            raise StoreClosed()
        now = self._clock.now()
        checkpoints = events = receipts = dispatches = 0
        cursor: str | None = None
        while True:
            step = await self._db.write(
                functools.partial(retention.threads_step, now=now, policy=policy, after=cursor)
            )
            checkpoints += step.checkpoints
            events += step.events
            cursor = step.cursor
            if step.finished:
                break
        if policy.receipt_max_age is not None:
            age = policy.receipt_max_age
            while (n := await self._db.write(lambda c: retention.receipts_step(c, now, age))) > 0:
                receipts += n
        if policy.settled_dispatch_max_age is not None:
            age = policy.settled_dispatch_max_age
            while (n := await self._db.write(lambda c: retention.dispatches_step(c, now, age))) > 0:
                dispatches += n
        return PruneReport(
            checkpoints=checkpoints, events=events, receipts=receipts, dispatches=dispatches
        )

    # ------------------------------------------------------------ queue

    async def enqueue(self, dispatch: Dispatch) -> Dispatch:
        d = check_dispatch(dispatch)
        if d.kind not in DISPATCH_KINDS:
            raise InvalidInput("kind", f"must be one of {sorted(DISPATCH_KINDS)}")
        return await self._write(lambda c, now: queue.enqueue(c, now, d))

    async def claim_next(
        self,
        holder: str,
        ttl: float,
        limit: int = 1,
        thread_id: str | None = None,
        *,
        version: str | None = None,
        take_starts: bool = True,
    ) -> list[Lease]:
        check_id("holder", holder)
        check_version(version)
        ttl = check_seconds("ttl", ttl)
        limit = check_count("limit", limit, minimum=1, maximum=1000)
        if thread_id is not None:
            check_id("thread_id", thread_id)
        starts = bool(take_starts)
        return await self._write(
            lambda c, now: queue.claim_next(c, now, holder, ttl, limit, thread_id, version, starts)
        )

    async def settle(self, dispatch_id: str, token: int, outcome: Outcome) -> Dispatch:
        check_id("dispatch_id", dispatch_id)
        check_token(token)
        check_outcome(outcome)
        return await self._write(lambda c, now: queue.settle(c, now, dispatch_id, token, outcome))

    async def cancel(self, thread_id: str, reason: str) -> Dispatch:
        check_id("thread_id", thread_id)
        check_text("reason", reason)
        return await self._write(lambda c, now: queue.cancel(c, now, thread_id, reason))

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        check_id("dispatch_id", dispatch_id)
        return await self._read(lambda c: queue.get(c, dispatch_id))

    async def list_dispatches(
        self,
        status: DispatchStatus | None = None,
        thread_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
        tenant: str | None = None,
    ) -> list[Dispatch]:
        limit = check_listing(status, thread_id, after, limit, tenant)
        return await self._read(
            lambda c: queue.list_dispatches(c, status, thread_id, after, limit, tenant)
        )

    async def queue_depths(self, limit: int = 10_000) -> dict[DispatchStatus, int]:
        limit = check_depth_limit(limit)
        return await self._read(lambda c: queue.queue_depths(c, limit))

    async def quarantine(self, dispatch_id: str) -> Dispatch:
        check_id("dispatch_id", dispatch_id)
        return await self._write(lambda c, now: queue.quarantine(c, now, dispatch_id))

    async def requeue(self, dispatch_id: str) -> Dispatch:
        check_id("dispatch_id", dispatch_id)
        return await self._write(lambda c, now: queue.requeue(c, now, dispatch_id))

    async def purge(self, dispatch_id: str) -> None:
        check_id("dispatch_id", dispatch_id)
        await self._write(lambda c, now: queue.purge(c, now, dispatch_id))

    # ------------------------------------------------------------ workers

    async def release_pins(self, pin_grace: float, limit: int = 100) -> list[Dispatch]:
        pin_grace = check_seconds("pin_grace", pin_grace)
        limit = check_count("limit", limit, minimum=1, maximum=1000)
        return await self._write(lambda c, now: queue.release_pins(c, now, pin_grace, limit))

    async def migrate_runs(
        self, from_version: str, to_version: str, limit: int = 100
    ) -> list[Dispatch]:
        source, target, limit = check_migration(from_version, to_version, limit)
        moved = await self._write(
            lambda c, now: migrate.migrate_runs(c, now, source, target, limit)
        )
        for thread_id in {d.thread_id for d in moved}:
            self._watcher.notify(thread_id)
        return moved

    async def register_worker(
        self, worker_id: str, *, version: str | None = None
    ) -> WorkerIdentity:
        check_id("worker_id", worker_id)
        check_version(version)
        return await self._write(lambda c, now: queue.register_worker(c, now, worker_id, version))

    async def heartbeat(self, identity: WorkerIdentity) -> None:
        check_id("worker_id", identity.worker_id)
        await self._write(lambda c, now: queue.heartbeat(c, now, identity))

    async def retire_worker(self, identity: WorkerIdentity) -> WorkerInfo:
        check_id("worker_id", identity.worker_id)
        return await self._write(lambda c, now: queue.retire_worker(c, now, identity))

    async def list_workers(self) -> list[WorkerInfo]:
        return await self._read(queue.list_workers)

    # ------------------------------------------------------------ inbox / outbox

    async def inbox(self, thread_id: str) -> list[InboxMessage]:
        check_id("thread_id", thread_id)
        return await self._read(lambda c: reads.inbox(c, thread_id))

    async def relay_outbox(self, limit: int = 100) -> int:
        limit = check_count("limit", limit, minimum=1)
        handled = 0
        after = 0
        while handled < limit:
            # One transaction per entry: its append, dispatch and unstaging commit together.
            stage = await self._write(functools.partial(messaging.relay_one, after_stage=after))
            if stage is None:
                break
            after = stage
            handled += 1
        return handled


MAX_PUTS = 500
"""Stream-checkpoint puts written by one write job at most."""


class SqliteStreamCheckpoints:
    """Stream checkpoints in the ``stream_checkpoints`` table; every failure is a
    ``StreamCheckpointError`` (``invalid``, ``stale`` or ``storage``).

    Puts are grouped: a put waits in a queue and one task writes everything queued as one
    write job (in the writer's next transaction), each row fenced and answered on its own.
    A job per put cost a hand-off to the writer thread and back and, in a shared
    transaction, a savepoint of its own (two more statements) for each put."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._queue: list[streamputs.Queued] = []
        self._writer: BackgroundTask | None = None
        self.batches = 0
        """Write jobs that stored puts (for tests and benchmarks)."""

    async def get(self, run_id: str) -> StreamCheckpoint | None:
        _checked_run_id(run_id)
        try:
            return await self._store._read(lambda c: messaging.get_stream_checkpoint(c, run_id))
        except StreamCheckpointError:
            raise
        except WakefulError as exc:
            raise StreamCheckpointError(run_id, "storage", str(exc)) from exc

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        await self.put_soon(checkpoint)

    def put_soon(self, checkpoint: StreamCheckpoint) -> asyncio.Future[None]:
        """``put`` as a future (``wakeful.store.streamputs``): validated and queued now,
        raising as ``put`` does; the future ends as the awaited ``put`` would."""
        done = streamputs.enqueue(self._queue, checkpoint, self._store._closed)
        if self._writer is None or not self._writer.running:
            self._writer = BackgroundTask("wakeful-sqlite-stream-puts", self._write)
            self._writer.start()
        return done

    async def _write(self, signal: StopSignal) -> None:
        """Write what is queued, batch after batch, until the queue is empty (or stopped:
        what is left then fails as the store closing)."""
        while self._queue and not signal.is_set():
            batch, self._queue = self._queue[:MAX_PUTS], self._queue[MAX_PUTS:]
            rows = [c for c, _ in batch]
            try:
                stored = await self._store._write(
                    functools.partial(messaging.put_stream_checkpoints, checkpoints=rows)
                )
            except Exception as exc:
                streamputs.fail(batch, exc)
                continue
            self.batches += 1
            for item, ok in zip(batch, stored, strict=True):
                streamputs.answer(item, ok)
        self._fail_queued()

    def _fail_queued(self) -> None:
        queued, self._queue = self._queue, []
        streamputs.fail(queued, StoreClosed())

    async def close(self) -> None:
        """Stop the writer (bounded, see ``wakeful.background``); queued puts fail."""
        if self._writer is not None:
            await self._writer.stop()
            self._writer = None
        self._fail_queued()

    async def delete(self, run_id: str) -> None:
        _checked_run_id(run_id)
        try:
            await self._store._write(lambda c, _: messaging.delete_stream_checkpoint(c, run_id))
        except WakefulError as exc:
            raise StreamCheckpointError(run_id, "storage", str(exc)) from exc

    async def discard(self, run_id: str, task_id: str, token: int) -> None:
        check_discard(run_id, task_id, token)
        try:
            await self._store._write(
                lambda c, _: messaging.discard_stream_checkpoint(c, run_id, task_id, token)
            )
        except WakefulError as exc:
            raise StreamCheckpointError(run_id, "storage", str(exc)) from exc


def _checked_run_id(run_id: str) -> str:
    try:
        return check_id("run_id", run_id)
    except WakefulError as exc:
        raise StreamCheckpointError(str(run_id)[:40], "invalid", str(exc)) from exc
