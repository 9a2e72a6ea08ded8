"""Concurrency keys under concurrent writers on PostgreSQL (issue 39.1): submitters,
claimers and settlers on several connections at once, two keys. The runs leased at once
per key (counted from lease to settle by the claimers themselves) never exceed the key's
limit, nothing is lost or stuck, and the keys' use is empty at the end. Deadlocks between
two keys' rows, if any, are retried by the store (decision 0051)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from tests.postgres_support import Databases
from wakeful import open_store
from wakeful.records import Dispatch, Done, Retry
from wakeful.store.contract import ConcurrencyStore, Store

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

LIMITS = {"a": 2, "b": 3}
PER_KEY = 30


def _dispatch(key: str, i: int) -> Dispatch:
    return Dispatch(
        dispatch_id=f"{key}-{i}", thread_id=f"t-{key}-{i}", kind="start",
        tenant=f"tenant-{i % 3}", concurrency_key=key, concurrency_limit=LIMITS[key],
    )  # fmt: skip


async def test_concurrent_submitters_and_claimers_never_exceed_a_keys_limit(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    stores: list[Store] = [await open_store(dsn) for _ in range(3)]
    rng = random.Random(39)
    todo = [_dispatch(k, i) for k in LIMITS for i in range(PER_KEY)]
    rng.shuffle(todo)
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    done: set[str] = set()
    retried: set[str] = set()

    async def submitter(store: Store) -> None:
        while todo:
            await store.enqueue(todo.pop())
            await asyncio.sleep(0)

    async def claimer(store: Store, name: str) -> None:
        idle = 0
        while len(done) < len(LIMITS) * PER_KEY and idle < 400:
            leases = await store.claim_next(name, 30, limit=3)
            if not leases:
                idle += 1
                await asyncio.sleep(0.01)
                continue
            idle = 0
            for lease in leases:
                key = lease.dispatch.concurrency_key
                assert key is not None
                running[key] += 1
                peak[key] = max(peak[key], running[key])
            await asyncio.sleep(rng.random() * 0.01)
            for lease in leases:
                d = lease.dispatch
                assert d.concurrency_key is not None
                running[d.concurrency_key] -= 1
                if d.dispatch_id not in retried and rng.random() < 0.2:
                    retried.add(d.dispatch_id)
                    await store.settle(d.dispatch_id, lease.claim.token, Retry(0, "again"))
                else:
                    await store.settle(d.dispatch_id, lease.claim.token, Done())
                    done.add(d.dispatch_id)

    try:
        await asyncio.gather(
            *(submitter(s) for s in stores),
            *(claimer(s, f"w{i}") for i, s in enumerate(stores * 2)),
        )
        assert done == {f"{k}-{i}" for k in LIMITS for i in range(PER_KEY)}
        assert all(peak[k] <= LIMITS[k] for k in LIMITS), peak
        assert peak == LIMITS, f"the limits were reached: {peak}"
        store = stores[0]
        assert isinstance(store, ConcurrencyStore)
        assert await store.concurrency_keys() == []
        depths = await store.queue_depths()
        assert (depths["pending"], depths["waiting_key"], depths["leased"]) == (0, 0, 0)
    finally:
        for s in stores:
            await s.close()
