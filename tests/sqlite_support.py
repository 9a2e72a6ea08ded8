"""Helpers for the SQLite store tests: fresh database files, a store proxy that alternates
between two store objects on one file, and running child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Self

from wakeful.concurrency import KeyUse
from wakeful.limits import LimitBucket, LimitWaiter, RateLimit
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
    Schedule,
    StreamCheckpoint,
    ThreadSnapshot,
    ThreadSummary,
    WorkerIdentity,
    WorkerInfo,
)
from wakeful.store.contract import (
    ConcurrencyStore,
    RateLimitStore,
    Store,
    StreamCheckpointStore,
)
from wakeful.store.firings import Fired, Firing, TickStore

ROOT = Path(__file__).resolve().parent.parent


def sqlite_url(path: Path | str) -> str:
    """The ``sqlite:///`` URL of an absolute path (four slashes)."""
    return f"sqlite:///{Path(path).resolve()}"


class ScratchFiles:
    """Fresh database paths under one temporary directory, removed by ``cleanup``."""

    def __init__(self) -> None:
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._count = 0

    def new_path(self) -> Path:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="wakeful-sqlite-")
        self._count += 1
        return Path(self._dir.name) / f"store-{self._count}.db"

    def cleanup(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


class Alternating:
    """A store that sends each call to the next of two store objects on one file, so every
    step of a conformance case crosses from one connection set to the other."""

    def __init__(self, first: Store, second: Store) -> None:
        self.stores = (first, second)
        self._calls = 0
        self._stream = _AlternatingStream(self)

    def next(self) -> Store:
        self._calls += 1
        return self.stores[self._calls % 2]

    @property
    def stream_checkpoints(self) -> StreamCheckpointStore:
        return self._stream

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for store in self.stores:
            await store.close()

    async def claim(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None = None
    ) -> Claim:
        return await self.next().claim(thread_id, holder, ttl, tenant)

    def _limits(self) -> RateLimitStore:
        store = self.next()
        assert isinstance(store, RateLimitStore)
        return store

    async def take_limit(
        self,
        limit: RateLimit,
        requests: int,
        tokens: int,
        settle: int = 0,
        waiter: LimitWaiter | None = None,
    ) -> float:
        return await self._limits().take_limit(limit, requests, tokens, settle, waiter)

    async def reconcile_limit(self, key: str, tokens: int) -> None:
        await self._limits().reconcile_limit(key, tokens)

    async def block_limit(self, key: str, seconds: float) -> None:
        await self._limits().block_limit(key, seconds)

    async def limit_buckets(self) -> list[LimitBucket]:
        return await self._limits().limit_buckets()

    async def concurrency_keys(self) -> list[KeyUse]:
        store = self.next()
        assert isinstance(store, ConcurrencyStore)
        return await store.concurrency_keys()

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        return await self.next().renew(thread_id, token, ttl)

    async def release(self, thread_id: str, token: int) -> None:
        await self.next().release(thread_id, token)

    async def commit(self, thread_id: str, commit: Commit) -> Receipt:
        return await self.next().commit(thread_id, commit)

    async def claim_and_commit(
        self, thread_id: str, holder: str, ttl: float, commit: Commit
    ) -> tuple[Claim, Receipt]:
        return await self.next().claim_and_commit(thread_id, holder, ttl, commit)

    async def read(self, thread_id: str) -> ThreadSnapshot | None:
        return await self.next().read(thread_id)

    async def operation(self, thread_id: str, operation_id: str) -> Receipt | None:
        return await self.next().operation(thread_id, operation_id)

    async def messages(self, thread_id: str, after: int = 0, limit: int = 100) -> list[Message]:
        return await self.next().messages(thread_id, after, limit)

    async def branch_messages(
        self, thread_id: str, branch: int, after: int = 0, limit: int = 100
    ) -> list[Message]:
        return await self.next().branch_messages(thread_id, branch, after, limit)

    async def branches(self, thread_id: str) -> list[Branch]:
        return await self.next().branches(thread_id)

    async def history(
        self, thread_id: str, before: str | None = None, limit: int = 50
    ) -> list[CheckpointEntry]:
        return await self.next().history(thread_id, before, limit)

    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointEntry | None:
        return await self.next().get_checkpoint(thread_id, checkpoint_id)

    async def events_after(
        self, thread_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[Event]:
        return await self.next().events_after(thread_id, after_seq, limit)

    async def wait_events(
        self, thread_id: str, after_seq: int = 0, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        return await self.next().wait_events(thread_id, after_seq, limit, timeout)

    async def list_threads(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[ThreadSummary]:
        return await self.next().list_threads(tenant, after, limit)

    async def checkpoints(
        self, thread_id: str, before: str | None = None, limit: int = 100
    ) -> list[tuple[Checkpoint, datetime]]:
        return await self.next().checkpoints(thread_id, before, limit)

    async def runs(
        self, thread_id: str, before: str | None = None, limit: int = 20
    ) -> list[RunSegment]:
        return await self.next().runs(thread_id, before, limit)

    async def compact_events(self, thread_id: str, before_seq: int) -> int:
        return await self.next().compact_events(thread_id, before_seq)

    async def delete_thread(self, thread_id: str) -> None:
        await self.next().delete_thread(thread_id)

    async def prune(self, policy: RetentionPolicy) -> PruneReport:
        return await self.next().prune(policy)

    async def enqueue(self, dispatch: Dispatch) -> Dispatch:
        return await self.next().enqueue(dispatch)

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
        return await self.next().claim_next(
            holder, ttl, limit, thread_id, version=version, take_starts=take_starts
        )

    async def release_pins(self, pin_grace: float, limit: int = 100) -> list[Dispatch]:
        return await self.next().release_pins(pin_grace, limit)

    async def migrate_runs(
        self, from_version: str, to_version: str, limit: int = 100
    ) -> list[Dispatch]:
        return await self.next().migrate_runs(from_version, to_version, limit)

    async def settle(self, dispatch_id: str, token: int, outcome: Outcome) -> Dispatch:
        return await self.next().settle(dispatch_id, token, outcome)

    async def cancel(self, thread_id: str, reason: str) -> Dispatch:
        return await self.next().cancel(thread_id, reason)

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        return await self.next().get_dispatch(dispatch_id)

    async def list_dispatches(
        self,
        status: DispatchStatus | None = None,
        thread_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
        tenant: str | None = None,
    ) -> list[Dispatch]:
        return await self.next().list_dispatches(status, thread_id, after, limit, tenant)

    async def queue_depths(self, limit: int = 10_000) -> dict[DispatchStatus, int]:
        return await self.next().queue_depths(limit)

    async def quarantine(self, dispatch_id: str) -> Dispatch:
        return await self.next().quarantine(dispatch_id)

    async def requeue(self, dispatch_id: str) -> Dispatch:
        return await self.next().requeue(dispatch_id)

    async def purge(self, dispatch_id: str) -> None:
        await self.next().purge(dispatch_id)

    async def register_worker(
        self, worker_id: str, *, version: str | None = None
    ) -> WorkerIdentity:
        return await self.next().register_worker(worker_id, version=version)

    async def heartbeat(self, identity: WorkerIdentity) -> None:
        await self.next().heartbeat(identity)

    async def retire_worker(self, identity: WorkerIdentity) -> WorkerInfo:
        return await self.next().retire_worker(identity)

    async def list_workers(self) -> list[WorkerInfo]:
        return await self.next().list_workers()

    async def inbox(self, thread_id: str) -> list[InboxMessage]:
        return await self.next().inbox(thread_id)

    async def relay_outbox(self, limit: int = 100) -> int:
        return await self.next().relay_outbox(limit)

    async def store_now(self) -> datetime:
        return await self.next().store_now()

    async def put_schedule(
        self, schedule: Schedule, expected_revision: int | None = None
    ) -> Schedule | None:
        return await self.next().put_schedule(schedule, expected_revision)

    async def get_schedule(self, name: str) -> Schedule | None:
        return await self.next().get_schedule(name)

    async def list_schedules(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Schedule]:
        return await self.next().list_schedules(tenant, after, limit)

    async def delete_schedule(self, name: str) -> bool:
        return await self.next().delete_schedule(name)

    async def due_schedules(self, limit: int = 100) -> tuple[datetime, list[Schedule]]:
        return await self.next().due_schedules(limit)

    def _ticks(self) -> TickStore:
        store = self.next()
        assert isinstance(store, TickStore)
        return store

    async def fire_schedules(self, firings: Sequence[Firing]) -> Fired:
        return await self._ticks().fire_schedules(firings)

    async def unfinished_runs(self, dispatch_ids: Sequence[str]) -> set[str]:
        return await self._ticks().unfinished_runs(dispatch_ids)

    async def next_schedule_due(self) -> tuple[datetime, datetime | None]:
        return await self._ticks().next_schedule_due()


class _AlternatingStream:
    def __init__(self, owner: Alternating) -> None:
        self._owner = owner

    async def get(self, run_id: str) -> StreamCheckpoint | None:
        return await self._owner.next().stream_checkpoints.get(run_id)

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        await self._owner.next().stream_checkpoints.put(checkpoint)

    async def delete(self, run_id: str) -> None:
        await self._owner.next().stream_checkpoints.delete(run_id)

    async def discard(self, run_id: str, task_id: str, token: int) -> None:
        await self._owner.next().stream_checkpoints.discard(run_id, task_id, token)


class Child:
    """A child process running ``tests.sqlite_child`` that reports JSON lines on stdout."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sqlite_child", *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def lines(self) -> Iterator[dict[str, Any]]:
        """Every JSON line the child prints, as it prints it, until it exits."""
        for line in self.stdout:
            yield json.loads(line)

    def expect(self, kind: str) -> dict[str, Any]:
        """The next report, which must be of ``kind``."""
        line = self.stdout.readline()
        if not line:
            raise AssertionError(f"child exited before reporting {kind!r}: {self.errors()}")
        report: dict[str, Any] = json.loads(line)
        assert report.get("kind") == kind, report
        return report

    def finish(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Wait for the child to exit successfully; returns its remaining reports."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def errors(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed (then fail)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
