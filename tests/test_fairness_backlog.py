"""Tenant fairness at scale (issue 39.3): tenant A has 20,000 pending dispatches, tenant B
submits one; B's is the next claim (within the next claim of each of N workers, N = 4
here), on PostgreSQL and SQLite. The testkit's ``FairCases`` check the same with a small
backlog on every store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.postgres_support import Databases
from wakeful import open_store
from wakeful.records import Dispatch, Done
from wakeful.store.contract import Store

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

BACKLOG = 20_000
WORKERS = 4


def _d(tenant: str, i: int) -> Dispatch:
    return Dispatch(
        dispatch_id=f"{tenant}-{i}", thread_id=f"{tenant}-t{i}", kind="start", tenant=tenant
    )


async def test_sqlite(tmp_path: Path) -> None:
    async with open_store(f"sqlite:///{tmp_path / 'fair.db'}") as store:
        await one_dispatch_is_claimed_before_a_20000_backlog_of_another_tenant(store)


@pytest.mark.postgres
async def test_postgres(pg_databases: Databases) -> None:
    async with open_store(await pg_databases.clone()) as store:
        await one_dispatch_is_claimed_before_a_20000_backlog_of_another_tenant(store)


async def one_dispatch_is_claimed_before_a_20000_backlog_of_another_tenant(store: Store) -> None:
    for start in range(0, BACKLOG, 100):
        await asyncio.gather(*(store.enqueue(_d("a", i)) for i in range(start, start + 100)))
    served = []
    for _ in range(WORKERS):  # the backlog is being served by every worker
        (lease,) = await store.claim_next("w", 30)
        served.append(lease)
    await store.enqueue(_d("b", 0))
    claims = [await store.claim_next(f"w-{i}", 30) for i in range(WORKERS)]
    taken = [lease.dispatch.dispatch_id for batch in claims for lease in batch]
    assert "b-0" in taken, taken
    assert taken[0] == "b-0", "the very next claim takes it"
    for lease in served:
        await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
    assert (await store.queue_depths(limit=10**6))["pending"] == BACKLOG - 2 * WORKERS + 1
