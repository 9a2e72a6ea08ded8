"""Durable LangGraph thread records (decision 0053): a thread's tenant, metadata, graph and
times, kept in the server's store so a restarted server (or another server over the same
store) knows them.

Each record is a wakeful thread of its own, ``langgraph:thread:{thread_id}``, holding one
checkpoint whose state is the record. It is written by ``claim_and_commit`` (one atomic,
fenced step that claims and releases the record thread) with ``expected_version``, so
concurrent writers are serialised by compare-and-set, and the record thread's tenant is
fixed by its first commit: a write for another tenant is ``TenantMismatch``. An update
drops the previous checkpoint in the same commit, so a record stays one checkpoint.

No new table or migration: this works identically on every store (memory, file, SQLite,
PostgreSQL). ``search`` pages through the tenant's threads (``list_threads`` by tenant,
starting at the record prefix) and filters metadata in Python: its cost grows with the
tenant's number of LangGraph threads.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import msgspec

from wakeful.errors import TenantMismatch, ThreadBusy, VersionConflict, WakefulError
from wakeful.records import Checkpoint, Commit
from wakeful.store.contract import Store

PREFIX = "langgraph:thread:"
"""The wakeful thread of a LangGraph thread's record: ``PREFIX + thread_id``."""
HOLDER = "langgraph-api"
KIND = "langgraph-thread-record"
TRIES = 8
PAGE = 500


class ThreadEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One durable thread record. ``graph``: the graph its runs use (set by its first run)."""

    thread_id: str
    tenant: str | None
    metadata: dict[str, Any]
    created_at: str
    updated_at: str
    graph: str | None = None


def _now() -> str:
    return datetime.now(UTC).isoformat()


def record_thread(thread_id: str) -> str:
    return PREFIX + thread_id


class Exists(Exception):
    """``create`` of a thread that already has a record."""


class ThreadRecords:
    """The durable thread records over ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def get(self, thread_id: str) -> ThreadEntry | None:
        snap = await self.store.read(record_thread(thread_id))
        if snap is None or snap.checkpoint is None or not _is_record(snap.checkpoint.state):
            return None
        return _entry(snap.checkpoint.state, snap.tenant)

    async def create(
        self,
        thread_id: str,
        tenant: str | None,
        metadata: dict[str, Any],
        graph: str | None = None,
    ) -> ThreadEntry:
        """Store a new record; ``Exists`` if the thread has one (of any tenant)."""
        at = _now()
        entry = ThreadEntry(
            thread_id=thread_id,
            tenant=tenant,
            metadata=metadata,
            created_at=at,
            updated_at=at,
            graph=graph,
        )
        try:
            await self._write(entry, None, 0)
        except (VersionConflict, ThreadBusy, TenantMismatch):
            raise Exists(thread_id) from None
        return entry

    async def update(
        self,
        thread_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        graph: str | None = None,
    ) -> ThreadEntry | None:
        """Merge ``metadata`` into the record (LangGraph's PATCH semantics) and set
        ``graph`` when given; ``None`` if the thread has no record. Retried on a concurrent
        write (compare-and-set on the record thread's version)."""
        for _ in range(TRIES):
            snap = await self.store.read(record_thread(thread_id))
            if snap is None or snap.checkpoint is None or not _is_record(snap.checkpoint.state):
                return None
            old = _entry(snap.checkpoint.state, snap.tenant)
            new = msgspec.structs.replace(
                old,
                metadata={**old.metadata, **(metadata or {})},
                graph=graph if graph is not None else old.graph,
                updated_at=_now(),
            )
            try:
                await self._write(new, snap.checkpoint.id, snap.version)
                return new
            except (VersionConflict, ThreadBusy):
                continue
        raise ThreadBusy(record_thread(thread_id), HOLDER, None)

    async def learn_graph(self, thread_id: str, graph: str) -> None:
        """Record the graph of a thread's first run. Best effort: a record that cannot be
        written now (contended, or none) is told again by the next process's first run,
        and the graph is also in the thread's checkpoints."""
        with contextlib.suppress(WakefulError):
            await self.update(thread_id, graph=graph)

    async def delete(self, thread_id: str) -> None:
        await self.store.delete_thread(record_thread(thread_id))

    async def scan(self, tenant: str | None, *, every_tenant: bool) -> AsyncIterator[ThreadEntry]:
        """The records of ``tenant`` (of every tenant when ``every_tenant``), by thread id."""
        after = PREFIX
        while True:
            page = await self.store.list_threads(
                tenant=None if every_tenant else tenant, after=after, limit=PAGE
            )
            for summary in page:
                if not summary.thread_id.startswith(PREFIX):
                    if _past(summary.thread_id):
                        return
                    continue
                if not every_tenant and summary.tenant != tenant:
                    continue
                entry = await self.get(summary.thread_id[len(PREFIX) :])
                if entry is not None:
                    yield entry
            if len(page) < PAGE:
                return
            after = page[-1].thread_id

    async def _write(self, entry: ThreadEntry, parent: str | None, version: int) -> None:
        checkpoint = Checkpoint(
            id=uuid.uuid4().hex,
            parent=parent,
            run_id=KIND,
            status="completed",
            state={"kind": KIND, **msgspec.to_builtins(entry)},
            created_at=datetime.now(UTC),
            tenant=entry.tenant,
        )
        commit = Commit(
            token=0,
            checkpoint=checkpoint,
            expected_version=version,
            release=True,
            drop_checkpoints=() if parent is None else (parent,),
        )
        await self.store.claim_and_commit(record_thread(entry.thread_id), HOLDER, 30.0, commit)


def _past(thread_id: str) -> bool:
    """Whether ``thread_id`` (not a record's) sorts after every record's id. The database
    orders ids by its collation: in ``C`` the records are one contiguous range, but a
    linguistic collation compares letters and digits first (``langgraph-thread-x`` can sort
    between records), so the scan stops only at an id whose letters and digits leave the
    prefix's."""
    key = "".join(ch for ch in thread_id.lower() if ch.isalnum())
    return not key.startswith(ANCHOR)


ANCHOR = "".join(ch for ch in PREFIX if ch.isalnum())


def _is_record(state: Any) -> bool:
    """Whether a checkpoint's state is a record (not a wakeful thread that took the name)."""
    return isinstance(state, dict) and state.get("kind") == KIND


def _entry(state: Any, tenant: str | None) -> ThreadEntry:
    fields = {k: v for k, v in dict(state).items() if k != "kind"}
    fields["tenant"] = tenant
    return msgspec.convert(fields, ThreadEntry)
