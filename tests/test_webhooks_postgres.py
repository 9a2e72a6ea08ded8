"""Webhooks over PostgreSQL (issue 43): the receiver answers 500 twice, then 200; retries are
due by the server's (frozen, moved by the test) clock; one webhook id, three attempts, valid
signatures, and the delivery record is the webhook thread's latest checkpoint."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import SCHEMA, Databases, freeze_clock, open_test_store
from tests.webhook_app import registry
from tests.webhook_support import receiver
from wakeful.fleet import Worker, submit
from wakeful.fleet.webhook_signing import new_secret, verify
from wakeful.fleet.webhooks import WebhookConfig, WebhookRecord, recent_webhooks
from wakeful.runtime import ClaimPolicy
from wakeful.runtime.webhooks import WEBHOOK_THREAD_PREFIX
from wakeful.store.listing import list_threads

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def advance(dsn: str, seconds: float) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {}.test_clock SET at = at + %s").format(sql.Identifier(SCHEMA)),
            (timedelta(seconds=seconds),),
        )


async def attempts(store: object, n: int, status: str) -> WebhookRecord:
    for _ in range(1000):
        found = await recent_webhooks(store)  # type: ignore[arg-type]
        if found and found[0].attempts == n and found[0].status == status:
            return found[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no record of {n} attempts {status}")


async def test_500_twice_then_200_on_postgres(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    await freeze_clock(dsn)
    store = await open_test_store(dsn)
    secret = new_secret()
    config = WebhookConfig(secrets=(secret,), allow_private=True)
    worker = Worker(
        store, registry, claims=ClaimPolicy(ttl=30, renew_every=10), poll_interval=0.02,
        webhooks=config,
    )  # fmt: skip
    running = asyncio.create_task(worker.run())
    try:
        with receiver([500, 500]) as got:
            await submit(store, "t1", "echo", {"log": ["in"]}, webhook=got.url)
            await attempts(store, 1, "pending")
            await advance(dsn, 5)
            await attempts(store, 2, "pending")
            await asyncio.sleep(0.2)
            assert got.count() == 2, "the third attempt waits for the store's clock"
            await advance(dsn, 10)
            done = await attempts(store, 3, "delivered")
        assert [r.headers["webhook-id"] for r in got.requests] == [done.webhook_id] * 3
        for r in got.requests:
            assert verify(secret, r.headers, r.body, now=float(r.headers["webhook-timestamp"]))
        assert json.loads(got.requests[0].body)["data"]["output"] == {"log": ["in", "echoed"]}
        stored = [t.thread_id for t in await store.list_threads()]
        assert stored == ["t1", f"{WEBHOOK_THREAD_PREFIX}{done.webhook_id}"]
        assert [t.thread_id for t in await list_threads(store)] == ["t1"]
        assert [t.thread_id for t in await list_threads(store, internal=True)] == stored
    finally:
        await worker.stop(2)
        await running
        await store.close()
