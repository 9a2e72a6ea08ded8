"""Busy threads on PostgreSQL beyond the conformance suite: migration 0014 of a queue with
several runs waiting on one thread, and submitters on separate pools racing on one thread."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import Databases, open_test_store
from wakeful.errors import StaleClaim, ThreadBusy
from wakeful.records import Dispatch, Done, IfBusy
from wakeful.store.postgres import migrations
from wakeful.store.postgres.connection import render

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def test_migration_0014_queues_the_runs_waiting_behind_another_of_their_thread(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    shipped = migrations.migrations()
    assert shipped[13][0] == 14
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier("old")))
        async with conn.transaction():
            for _, _, text in shipped[:13]:
                await conn.execute(render(text, conn, "old"))
            await conn.execute(
                "CREATE TABLE old.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, _ in shipped[:13]:
                await conn.execute(
                    "INSERT INTO old.schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
        # what a version-13 process could leave: several pending runs of one thread
        for i, (thread, kind) in enumerate(
            [("t1", "start"), ("t1", "start"), ("t1", "message"), ("t2", "start")]
        ):
            await conn.execute(
                f"SELECT old.enqueue('d-{i}', '{thread}', '{kind}', '{{}}', 0, NULL, 5, NULL, NULL)"
            )
    store = await open_test_store(dsn, schema="old")  # migrates to the latest
    try:
        got = {d.dispatch_id: (d.status, d.queued_behind) for d in await store.list_dispatches()}
        assert got == {
            "d-0": ("pending", None),
            "d-1": ("queued", "d-0"),
            "d-2": ("queued", "d-1"),
            "d-3": ("pending", None),
        }
        [lease] = await store.claim_next("w", 30, thread_id="t1")
        await store.settle("d-0", lease.claim.token, Done())
        pending = await store.list_dispatches(status="pending")
        assert [d.dispatch_id for d in pending] == ["d-1", "d-3"]
        # a process of the previous release still enqueues through its own signature
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            row = await (
                await conn.execute(
                    "SELECT status, queued_behind FROM old.enqueue('d-9', 't1', 'start', "
                    "'{}', 0, NULL, 5, NULL, NULL)"
                )
            ).fetchone()
        assert row == ("queued", "d-2")
    finally:
        await store.close()


async def test_submitters_on_separate_pools_admit_one_run_of_the_thread_at_a_time(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    stores = [await open_test_store(dsn) for _ in range(3)]
    policies: tuple[IfBusy, ...] = ("enqueue", "reject", "interrupt", "coalesce")
    accepted: list[str] = []
    rejected: list[str] = []
    leased: list[str] = []

    async def submit(i: int) -> None:
        d = Dispatch(dispatch_id=f"s-{i:03d}", thread_id="t", kind="start")
        try:
            await stores[i % 3].enqueue(msgspec.structs.replace(d, if_busy=policies[i % 4]))
            accepted.append(d.dispatch_id)
        except ThreadBusy:
            rejected.append(d.dispatch_id)

    async def worker(n: int) -> None:
        store = stores[n]
        for _ in range(400):
            leases = await store.claim_next(f"w{n}", 30, limit=4)
            if not leases:
                await asyncio.sleep(0.005)
                continue
            for lease in leases:
                open_runs = [
                    d
                    for d in await store.list_dispatches(thread_id="t", limit=1000)
                    if d.kind == "start" and d.status in ("pending", "leased", "awaiting")
                ]
                assert len(open_runs) <= 1, open_runs
                if lease.dispatch.kind == "start":
                    leased.append(lease.dispatch.dispatch_id)
                with contextlib.suppress(StaleClaim):  # interrupted while it ran
                    await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())

    try:
        submitting = asyncio.gather(*(submit(i) for i in range(60)))
        await asyncio.gather(submitting, worker(0), worker(1))
        assert accepted and rejected
        assert len(leased) == len(set(leased)), "no run admitted twice"
        for store in stores:
            for name in rejected:
                assert await store.get_dispatch(name) is None
        stored = {d.dispatch_id: d for d in await stores[0].list_dispatches(limit=1000)}
        for name in accepted:
            d = stored[name]
            assert d.status in ("done", "queued", "pending"), d
            if d.answered_by is not None:
                assert name in stored[d.answered_by].coalesced
    finally:
        for store in stores:
            await store.close()
