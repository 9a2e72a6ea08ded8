"""The ``scheduled`` status on PostgreSQL beyond the conformance suite (issue 38): migration
0022 of delayed work stored ``pending`` by version 21, the due step's lock order (a thread
row another transaction holds is skipped, not waited for), and claimers on separate pools
moving due work on exactly once."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import SCHEMA, Databases, open_test_store
from wakeful.records import Dispatch, Done
from wakeful.store.postgres import migrations
from wakeful.store.postgres.connection import render

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def test_migration_0022_schedules_delayed_work_and_frees_the_slots_it_held(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    shipped = migrations.migrations()
    assert shipped[21][0] == 22
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier("old")))
        async with conn.transaction():
            for _, _, text in shipped[:21]:
                await conn.execute(render(text, conn, "old"))
            await conn.execute(
                "CREATE TABLE old.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, _ in shipped[:21]:
                await conn.execute(
                    "INSERT INTO old.schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
        later = "now() + interval '1 day'"
        # t1: a delayed run stored pending (it held the slot), a run queued behind it
        await conn.execute(
            f"SELECT old.enqueue('late', 't1', 'start', '{{}}', 0, {later}, 5, NULL, NULL)"
        )
        await conn.execute(
            "SELECT old.enqueue('next', 't1', 'start', '{}', 0, NULL, 5, NULL, NULL)"
        )
        # t2: a retry's backoff (leased once, pending until tomorrow), a run queued behind it
        await conn.execute(
            "SELECT old.enqueue('busy', 't2', 'start', '{}', 0, NULL, 5, NULL, NULL)"
        )
        await conn.execute(
            f"UPDATE old.dispatches SET attempts = 1, available_at = {later} "
            "WHERE dispatch_id = 'busy'"
        )
        await conn.execute(
            "SELECT old.enqueue('wait', 't2', 'start', '{}', 0, NULL, 5, NULL, NULL)"
        )
        rows = await (
            await conn.execute("SELECT dispatch_id, status FROM old.dispatches")
        ).fetchall()
        assert dict(rows) == {
            "late": "pending",
            "next": "queued",
            "busy": "pending",
            "wait": "queued",
        }
    store = await open_test_store(dsn, schema="old")  # migrates to the latest
    try:
        got = {d.dispatch_id: d.status for d in await store.list_dispatches()}
        assert got == {
            "late": "scheduled",
            "next": "pending",
            "busy": "scheduled",
            "wait": "queued",
        }
        leases = await store.claim_next("w", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in leases] == ["next"]
    finally:
        await store.close()


async def _delay_all(dsn: str, count: int) -> list[str]:
    """``count`` runs on threads of their own, due in an hour."""
    store = await open_test_store(dsn)
    try:
        later = await store.store_now() + timedelta(hours=1)
        ids = [f"d-{i:03d}" for i in range(count)]
        for i, did in enumerate(ids):
            d = Dispatch(dispatch_id=did, thread_id=f"t{i:03d}", kind="start", available_at=later)
            assert (await store.enqueue(d)).status == "scheduled"
        assert await store.claim_next("w", 30, limit=10) == []
    finally:
        await store.close()
    return ids


async def _make_due(dsn: str) -> None:
    """The store's clock passing their time (the rows' time moved instead of the clock)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            f"UPDATE {SCHEMA}.dispatches SET available_at = now() - interval '1 second' "
            "WHERE status = 'scheduled'"
        )


async def test_the_due_step_skips_a_thread_another_transaction_holds(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    await _delay_all(dsn, 3)
    await _make_due(dsn)
    store = await open_test_store(dsn)
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as holder:
            await holder.execute(
                f"SELECT 1 FROM {SCHEMA}.threads WHERE thread_id = 't001' FOR UPDATE"
            )
            leases = await asyncio.wait_for(store.claim_next("w", 30, limit=5), 10)
            assert sorted(x.dispatch.dispatch_id for x in leases) == ["d-000", "d-002"]
            skipped = await store.get_dispatch("d-001")
            assert skipped is not None and skipped.status == "scheduled"
            await holder.rollback()
        [lease] = await store.claim_next("w", 30, limit=5)
        assert lease.dispatch.dispatch_id == "d-001" and lease.dispatch.attempts == 1
    finally:
        await store.close()


async def test_claimers_on_separate_pools_move_due_work_on_once(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    ids = await _delay_all(dsn, 150)  # more than one due batch (100)
    await _make_due(dsn)
    stores = [await open_test_store(dsn) for _ in range(3)]
    leased: list[str] = []

    async def claimer(n: int) -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while len(leased) < len(ids):
            assert asyncio.get_running_loop().time() < deadline, f"{len(leased)} leased"
            leases = await stores[n].claim_next(f"w{n}", 30, limit=7)
            for lease in leases:
                leased.append(lease.dispatch.dispatch_id)
                await stores[n].settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
            if not leases:
                await asyncio.sleep(0.01)

    try:
        await asyncio.gather(*(claimer(n) for n in range(3)))
        assert sorted(leased) == ids  # each once
        done = await stores[0].list_dispatches(status="done", limit=1000)
        assert sorted(d.dispatch_id for d in done) == ids
        assert all(d.attempts == 1 for d in done)
    finally:
        for store in stores:
            await store.close()
