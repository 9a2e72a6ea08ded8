"""The whole conformance suite against the PostgreSQL store, each test in a fresh database.

The store judges time by the server. In these databases the store's clock is frozen
(``freeze_clock``) and ``advance_store_clock`` moves every stored time back, so expiry is
exact at its boundaries; ``exact_expiry`` stays False because the clock is the server's,
not the suite's ManualClock. ``relay_crash_injection`` is not declared: a relay of one entry
is one transaction, so there is no point between append and delete to crash at. These
connections run with ``synchronous_commit=off``: the suite checks the contract's semantics,
not crash durability (the process and fault tests keep the server's default).
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

import pytest
from psycopg.conninfo import make_conninfo

from tests.batch_firing_cases import BatchFiringCases
from tests.firing_cases import FiringCases
from tests.postgres_support import (
    Databases,
    freeze_clock,
    move_frozen_clock,
    move_stored_times_back,
    open_test_store,
    reset_database,
)
from wakeful.clock import ManualClock
from wakeful.store.contract import Store
from wakeful.store.postgres import PostgresStore
from wakeful.testkit import StoreConformance

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = pytest.mark.postgres


def _pg(store: Store) -> PostgresStore:
    assert isinstance(store, PostgresStore), store
    return store


class TestPostgresStore(StoreConformance, FiringCases, BatchFiringCases):
    capabilities: ClassVar[frozenset[str]] = frozenset({"folded_writes"})
    exact_expiry = False

    @pytest.fixture(autouse=True)
    def _fresh_databases(self, pg_databases: Databases) -> None:
        self._dbs = pg_databases
        self._stores: dict[str, list[PostgresStore]] = {}

    async def new_store(self, clock: ManualClock) -> Store:
        # The stateful case asks for a fresh store per example, after closing the last one:
        # a database whose stores are all closed is emptied and used again (cheaper than
        # cloning and dropping one per example).
        for dsn, stores in self._stores.items():
            if all(s.closed for s in stores):
                await reset_database(dsn)
                break
        else:
            dsn = await self._dbs.clone()
            await freeze_clock(dsn)
            # Contract semantics, not crash durability, are under test here: commits need not
            # wait for the WAL flush (the process and fault tests keep the default).
            dsn = make_conninfo(dsn, options="-c synchronous_commit=off")
        return await self._open(dsn)

    async def _open(self, dsn: str) -> PostgresStore:
        store = await open_test_store(dsn)
        self._stores.setdefault(dsn, []).append(store)
        return store

    async def reopen(self, store: Store, clock: ManualClock) -> Store:
        pg = _pg(store)
        await pg.close()
        return await self._open(pg.conninfo)

    async def sibling(self, store: Store, clock: ManualClock) -> Store:
        return await self._open(_pg(store).conninfo)

    async def advance_store_clock(self, store: Store, clock: ManualClock, seconds: float) -> None:
        clock.advance(seconds)
        await move_stored_times_back(_pg(store).conninfo, seconds)

    async def move_clock(self, store: Store, clock: ManualClock, seconds: float) -> None:
        clock.advance(seconds)
        await move_frozen_clock(_pg(store).conninfo, seconds)

    async def store_now(self, store: Store, clock: ManualClock) -> datetime:
        return await _pg(store).clock_now()
