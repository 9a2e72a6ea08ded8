"""The saver's fencing API: ``hold`` (and ``hold_sync``) a LangGraph thread's claim for a
block, ``release`` it now. Mixed into ``WakefulSaver``, which defines what is declared here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from wakeful.errors import InvalidState, StaleClaim, VersionConflict
from wakeful.langgraph.bridge import call_on
from wakeful.langgraph.codec import store_thread_id
from wakeful.langgraph.holds import Holds
from wakeful.langgraph.index import ThreadIndex
from wakeful.langgraph.maintenance import Maintenance
from wakeful.langgraph.runs import Runs
from wakeful.records import Claim
from wakeful.store.contract import Store


class FencingAPI(Maintenance):
    """Mixed into ``WakefulSaver`` (which sets the attributes and defines the methods
    declared here)."""

    store: Store
    holder: str
    _holds: Holds
    _runs: Runs
    _fenced: dict[str, StaleClaim | VersionConflict]
    _tenants: dict[str, str]
    _loop: asyncio.AbstractEventLoop | None

    def _lock(self, thread: str) -> asyncio.Lock:
        raise NotImplementedError

    async def _claimed_view(self, thread: str, claim: Claim) -> ThreadIndex:
        raise NotImplementedError

    @asynccontextmanager
    async def hold(self, thread_id: str) -> AsyncIterator[None]:
        """Claim LangGraph thread ``thread_id`` for the block, renewed in the background,
        released on exit. Raises ``ThreadBusy`` (naming the holder) if another live claim
        holds it. Inside, a write after the claim was taken over raises ``StaleClaim`` and
        writes nothing."""
        thread = self._bind(store_thread_id(thread_id))
        async with self._lock(thread):
            current = self._holds.get(thread)
            if current is not None and current.lost is None:
                if current.explicit:
                    raise InvalidState(
                        "thread", thread_id, "held", "this saver already holds it in a block"
                    )
                current.explicit = True
            else:
                self._holds.forget(thread)
                claim = await self.store.claim(thread, self.holder, self._holds.ttl)
                self._holds.start(claim, explicit=True)
                self._fenced.pop(thread, None)
                await self._claimed_view(thread, claim)
        try:
            yield
        finally:
            await self._holds.release(thread)

    @asynccontextmanager
    async def adopt(
        self, thread_id: str, claim: Claim, tenant: str | None = None
    ) -> AsyncIterator[None]:
        """Write LangGraph thread ``thread_id`` under ``claim`` for the block: a claim the
        caller took on its wakeful thread (a worker's lease, ``wakeful.langgraph.targets``).
        The saver renews it while the block runs, like a hold, and forgets it on exit
        without releasing it: the caller settles or releases it. Inside, a write after the
        claim was taken over (a newer lease, a cancel) raises ``StaleClaim`` and writes
        nothing. ``tenant``: the thread's tenant, named by the records written."""
        thread = self._bind(store_thread_id(thread_id))
        if claim.thread_id != thread:
            raise InvalidState("claim", str(claim.thread_id), "another thread", thread)
        async with self._lock(thread):
            self._holds.forget(thread)
            self._holds.start(claim, explicit=True)
            self._fenced.pop(thread, None)
            self._runs.fence(thread)  # a run of an earlier lease here writes nothing more
            if tenant is not None:
                self._tenants[thread] = tenant
            await self._claimed_view(thread, claim)
        try:
            yield
        finally:
            hold = self._holds.get(thread)
            if hold is not None and hold.claim.token == claim.token:
                self._holds.forget(thread)
                self._tenants.pop(thread, None)

    @contextmanager
    def hold_sync(self, thread_id: str) -> Iterator[None]:
        """``hold`` for synchronous code."""
        manager = self.hold(thread_id)
        call_on(self._loop, manager.__aenter__())
        try:
            yield
        finally:
            call_on(self._loop, manager.__aexit__(None, None, None))

    async def release(self, thread_id: str) -> None:
        """Release this saver's claim on ``thread_id`` now (a no-op if it holds none), and
        end the fenced state of a run refused with ``StaleClaim`` or ``VersionConflict``
        (its later writes are refused until a new run starts or this is called)."""
        thread = self._bind(store_thread_id(thread_id))
        self._fenced.pop(thread, None)
        self._runs.end(thread)
        await self._holds.release(thread)
