"""The conformance suite against the memory store, with zero skips."""

from __future__ import annotations

from typing import ClassVar

from tests.batch_firing_cases import BatchFiringCases
from tests.firing_cases import FiringCases
from wakeful.clock import ManualClock
from wakeful.store.contract import Store
from wakeful.store.memory import MemoryStore
from wakeful.testkit import StoreConformance


class TestMemoryStore(StoreConformance, FiringCases, BatchFiringCases):
    capabilities: ClassVar[frozenset[str]] = frozenset({"relay_crash_injection", "folded_writes"})

    async def new_store(self, clock: ManualClock) -> Store:
        return MemoryStore(clock)
