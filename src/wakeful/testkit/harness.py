"""The harness every conformance case runs in: the hooks a store's test class overrides and
the ``kit`` fixture the cases use."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, ClassVar

import pytest
import pytest_asyncio

from wakeful.clock import ManualClock
from wakeful.records import Checkpoint, Claim, Commit, Dispatch, EventDraft, Receipt
from wakeful.store.contract import Store

CAPABILITIES: dict[str, str] = {
    "relay_crash_injection": (
        "the store can be made to crash between a relay's inbox append and the deletion of "
        "the staged entry (stores whose relay is one transaction cannot and do not need to)"
    ),
    "folded_writes": (
        "Commit.release, Commit.settle and claim_and_commit (decision 0004); the runtime and "
        "the worker need them, the gate only lets an older store adopt them step by step"
    ),
}
"""Capabilities a store may declare; a case needing an undeclared one is skipped, saying so."""


class Harness:
    """Hooks a store's test class fills in. Only ``new_store`` is required."""

    capabilities: ClassVar[frozenset[str]] = frozenset()
    exact_expiry: ClassVar[bool] = True
    """False for stores that judge time by their own clock (a database server's): expiry
    is then checked by its effect instead of against the manual clock."""

    async def new_store(self, clock: ManualClock) -> Store:
        """Open a fresh, empty store judging time by ``clock`` where it can."""
        raise NotImplementedError("a conformance test class must implement new_store(clock)")

    async def reopen(self, store: Store, clock: ManualClock) -> Store:
        """Close ``store`` and open the same storage again, as a restarted process would.
        Default: the same instance (for stores that cannot outlive their process)."""
        return store

    async def sibling(self, store: Store, clock: ManualClock) -> Store:
        """Another handle on the same storage (another connection or process-like opener).
        Default: the same instance."""
        return store

    async def advance_store_clock(self, store: Store, clock: ManualClock, seconds: float) -> None:
        """Make ``seconds`` pass for the store's expiry judgements. Default: move ``clock``.
        A store with its own clock moves every stored expiry back instead."""
        clock.advance(seconds)

    async def move_clock(self, store: Store, clock: ManualClock, seconds: float) -> None:
        """Move the store's clock itself forward by ``seconds``, leaving stored times as they
        are (schedule ticks are instants: shifting stored times would shift them). Default:
        move ``clock``."""
        clock.advance(seconds)

    async def store_now(self, store: Store, clock: ManualClock) -> datetime:
        """The store's idea of now. Default: the manual clock."""
        return clock.now()

    async def inject_crash(self, store: Store, point: str) -> None:
        """Arm a one-shot crash at ``point`` (see ``CAPABILITIES``)."""
        crash_at = getattr(store, "crash_at", None)
        if crash_at is None:
            pytest.skip(f"{type(store).__name__} has no crash_at(point) to inject {point!r}")
        crash_at(point)

    @pytest_asyncio.fixture
    async def kit(self) -> AsyncIterator[Kit]:
        clock = ManualClock()
        store = await self.new_store(clock)
        kit = Kit(self, store, clock)
        try:
            yield kit
        finally:
            await kit.close_all()


class Kit:
    """What a case works with: the store under test, its clock and small builders."""

    def __init__(self, harness: Harness, store: Store, clock: ManualClock) -> None:
        self.harness = harness
        self.store = store
        self.clock = clock
        self._opened: list[Store] = [store]
        self._ids = 0

    @property
    def exact_expiry(self) -> bool:
        return self.harness.exact_expiry

    def require(self, capability: str) -> None:
        if capability not in self.harness.capabilities:
            pytest.skip(f"store does not declare {capability!r}: {CAPABILITIES[capability]}")

    async def advance(self, seconds: float) -> None:
        await self.harness.advance_store_clock(self.store, self.clock, seconds)

    async def move_clock(self, seconds: float) -> None:
        await self.harness.move_clock(self.store, self.clock, seconds)

    async def now(self) -> datetime:
        return await self.harness.store_now(self.store, self.clock)

    async def reopen(self) -> Store:
        reopened = await self.harness.reopen(self.store, self.clock)
        if reopened is not self.store:
            self._opened.append(reopened)
        self.store = reopened
        return reopened

    async def sibling(self) -> Store:
        other = await self.harness.sibling(self.store, self.clock)
        if all(other is not s for s in self._opened):
            self._opened.append(other)
        return other

    async def close_all(self) -> None:
        for store in reversed(self._opened):
            await store.close()

    # ---------------------------------------------------------------- builders

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    def checkpoint(
        self,
        parent: str | None,
        *,
        id: str | None = None,
        state: Any = None,
        status: Any = "running",
        run_id: str = "run-1",
        tenant: str | None = None,
    ) -> Checkpoint:
        return Checkpoint(
            id=id or self.next_id("cp"),
            parent=parent,
            run_id=run_id,
            status=status,
            state={"n": self._ids} if state is None else state,
            created_at=self.clock.now(),
            tenant=tenant,
        )

    async def claimed(self, thread_id: str, holder: str = "holder-a", ttl: float = 30) -> Claim:
        return await self.store.claim(thread_id, holder, ttl)

    async def started(
        self, thread_id: str, holder: str = "holder-a", tenant: str | None = None
    ) -> tuple[Claim, Receipt]:
        """Claim the thread and commit its first checkpoint with one event."""
        claim = await self.claimed(thread_id, holder)
        receipt = await self.store.commit(
            thread_id,
            Commit(
                token=claim.token,
                checkpoint=self.checkpoint(None, tenant=tenant),
                events=(EventDraft(type="started"),),
            ),
        )
        return claim, receipt

    def dispatch(
        self,
        thread_id: str,
        *,
        dispatch_id: str | None = None,
        kind: Any = "start",
        payload: Any = None,
        priority: int = 0,
        max_attempts: int = 3,
        dedupe_key: str | None = None,
        available_at: datetime | None = None,
    ) -> Dispatch:
        return Dispatch(
            dispatch_id=dispatch_id or self.next_id("d"),
            thread_id=thread_id,
            kind=kind,
            payload={"input": thread_id} if payload is None else payload,
            priority=priority,
            max_attempts=max_attempts,
            dedupe_key=dedupe_key,
            available_at=available_at,
        )
