"""The conformance suite against the file store, with a real reopen (close, then open the
same root again) and zero skips."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from tests.batch_firing_cases import BatchFiringCases
from tests.firing_cases import FiringCases
from wakeful.clock import ManualClock
from wakeful.store.contract import Store
from wakeful.store.file import FileStore, open_file_store
from wakeful.testkit import StoreConformance


class TestFileStore(StoreConformance, FiringCases, BatchFiringCases):
    capabilities: ClassVar[frozenset[str]] = frozenset({"relay_crash_injection", "folded_writes"})

    @pytest.fixture(autouse=True)
    def _roots(self, tmp_path: Path) -> None:
        self.base = tmp_path
        self.opened = 0

    async def new_store(self, clock: ManualClock) -> Store:
        self.opened += 1
        return await open_file_store((self.base / f"root-{self.opened}").as_uri(), clock=clock)

    async def reopen(self, store: Store, clock: ManualClock) -> Store:
        assert isinstance(store, FileStore)
        await store.close()
        return await open_file_store(store.root.as_uri(), clock=clock)
