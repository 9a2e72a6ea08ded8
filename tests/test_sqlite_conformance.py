"""The conformance suite against the SQLite store: one store object per case with real
``reopen`` (close, open the file again) and ``sibling`` (a second store object on the same
file), and a variant whose store alternates every call between two store objects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import pytest

from tests.batch_firing_cases import BatchFiringCases
from tests.firing_cases import FiringCases
from tests.sqlite_support import Alternating, ScratchFiles, sqlite_url
from wakeful.clock import ManualClock
from wakeful.store import open_store
from wakeful.store.contract import Store
from wakeful.store.sqlite import SqliteStore
from wakeful.testkit import StoreConformance

_files = ScratchFiles()


@pytest.fixture(autouse=True, scope="module")
def _scratch() -> Iterator[None]:
    yield
    _files.cleanup()


def _url_of(store: Store) -> str:
    if isinstance(store, Alternating):
        store = store.stores[0]
    assert isinstance(store, SqliteStore)
    return store.url


class TestSqliteStore(StoreConformance, FiringCases, BatchFiringCases):
    capabilities: ClassVar[frozenset[str]] = frozenset({"folded_writes"})

    async def new_store(self, clock: ManualClock) -> Store:
        return await open_store(sqlite_url(_files.new_path()), clock=clock)

    async def reopen(self, store: Store, clock: ManualClock) -> Store:
        url = _url_of(store)
        await store.close()
        return await open_store(url, clock=clock)

    async def sibling(self, store: Store, clock: ManualClock) -> Store:
        return await open_store(_url_of(store), clock=clock)


class TestSqliteAlternatingStores(TestSqliteStore):
    """Every call goes to the other of two store objects on the same file."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"folded_writes"})

    async def new_store(self, clock: ManualClock) -> Store:
        url = sqlite_url(_files.new_path())
        return Alternating(await open_store(url, clock=clock), await open_store(url, clock=clock))

    async def reopen(self, store: Store, clock: ManualClock) -> Store:
        url = _url_of(store)
        await store.close()
        return Alternating(await open_store(url, clock=clock), await open_store(url, clock=clock))
