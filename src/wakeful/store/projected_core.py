"""The core of ``ProjectedStore``: the projection, its persistence hook, the clock, change
waiters, and the helpers both halves of the contract (threads in ``projected``, the queue in
``projected_queue``) read the projection with.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Self

from wakeful.clock import Clock, SystemClock
from wakeful.errors import StoreClosed, TenantMismatch
from wakeful.records import Claim, PruneReport, ThreadSnapshot
from wakeful.store.projection import Committed, Mutation, State, ThreadState


class ProjectedCore:
    """The projection, the clock, change waiters and the store's lifecycle: what the thread
    and queue halves of ``ProjectedStore`` share. Subclasses decide how records are persisted."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()
        self._state = State()
        self._closed = False
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    # ------------------------------------------------------------ plumbing

    async def _persist(self, record: Mutation) -> None:
        """Make ``record`` durable. Called after it was applied; the memory store keeps
        nothing beyond the projection."""

    def _fault(self, point: str) -> None:
        """A named point where tests inject a crash; no-op unless a subclass arms it."""

    async def _persist_commit(self, record: Committed, commit_body: bytes) -> None:
        """``_persist`` for a commit record whose commit encodes as ``commit_body`` (its
        checked encoding, to be reused rather than encoded again)."""
        await self._persist(record)

    async def _record(self, record: Mutation) -> PruneReport | None:
        result = self._state.apply(record)
        await self._persist(record)
        return result

    async def _record_commit(self, record: Committed, commit_body: bytes) -> None:
        """``_record`` for a commit whose checked encoding is ``commit_body``."""
        self._state.apply(record)
        await self._persist_commit(record, commit_body)

    def _now(self) -> datetime:
        return self._clock.now()

    def now(self) -> datetime:
        """The store's clock."""
        return self._clock.now()

    def current_claim(self, thread_id: str) -> Claim | None:
        """The thread's current claim record (possibly expired), from the projection."""
        return claim_of(self._open(), thread_id)

    def _open(self) -> State:
        if self._closed:
            raise StoreClosed()
        return self._state

    def _notify(self, thread_id: str) -> None:
        for waiter in self._waiters.pop(thread_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def close(self) -> None:
        self._closed = True
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._waiters.clear()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ claims


# ---------------------------------------------------------------- helpers


def latest_checkpoint_id(t: ThreadState | None) -> str | None:
    if t is None:
        return None
    latest = t.latest
    return latest.id if latest is not None else None


def snapshot_of(t: ThreadState) -> ThreadSnapshot:
    return ThreadSnapshot(
        thread_id=t.thread_id,
        version=t.version,
        checkpoint=t.latest,
        writes=tuple(t.writes.values()),
        claim=t.claim,
        tenant=t.tenant,
        message_count=t.message_count,
        last_seq=t.next_seq - 1,
        event_floor=t.floor,
        branch=len(t.branches),
    )


def check_thread_tenant(state: State, thread_id: str, tenant: str | None) -> None:
    """``TenantMismatch`` for a write naming ``tenant`` on a thread fixed to another."""
    t = state.threads.get(thread_id)
    if t is not None and t.foreign(tenant):
        raise TenantMismatch(thread_id)


def claim_of(state: State, thread_id: str) -> Claim | None:
    t = state.threads.get(thread_id)
    return t.claim if t is not None else None
