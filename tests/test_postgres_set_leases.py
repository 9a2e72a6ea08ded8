"""The set-based lease call of schema version 11 (issue 22, third round): one call grants up
to its limit of leases in a few statements, never two on one thread, skips a thread another
transaction holds without failing the others, and returns with each lease the snapshot a
read of its thread returns."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import Databases, open_test_store
from wakeful.records import Checkpoint, Commit, Dispatch, Done, Lease, PendingWrite
from wakeful.store.postgres import migrations
from wakeful.store.postgres.connection import render
from wakeful.store.postgres.queue import _CLAIM_NEXT
from wakeful.store.postgres.store import PostgresStore

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

# since 0015 the call takes a version and the old signature wraps it: counted by signature
_CALLS = """
SELECT CASE WHEN p.pronargs = 5 THEN 'claim_next_read' ELSE p.proname || '/' || p.pronargs END,
       s.calls
  FROM pg_stat_xact_user_functions s JOIN pg_proc p ON p.oid = s.funcid
 WHERE s.schemaname = 'wakeful' AND s.funcname IN ('claim_next', 'claim_next_read')
"""


def _cp(cid: str, parent: str | None) -> Checkpoint:
    return Checkpoint(
        id=cid, parent=parent, run_id="r", status="running", state={"at": cid},
        created_at=datetime.now(UTC), metadata={"graph": "g"},
    )  # fmt: skip


async def _history(store: PostgresStore, thread_id: str, with_write: bool) -> None:
    """Two checkpoints on ``thread_id`` (and a pending write against the second), released."""
    claim = await store.claim(thread_id, "setup", 60)
    await store.commit(thread_id, Commit(token=claim.token, checkpoint=_cp(f"{thread_id}-1", None)))
    writes = (
        (PendingWrite(checkpoint_id=f"{thread_id}-2", task_id="t", node="n", value={"v": 1}),)
        if with_write
        else ()
    )
    last = _cp(f"{thread_id}-2", f"{thread_id}-1")
    await store.commit(thread_id, Commit(token=claim.token, checkpoint=last, writes=writes))
    await store.release(thread_id, claim.token)


# The lease statement of a process of version 10: the dispatch columns it knew (0013 added
# the busy-thread ones, 0015 the pins) and the call without a version (0015 added it).
_V10_CLAIM_NEXT = _CLAIM_NEXT.replace(
    ", (o_dispatch).if_busy, (o_dispatch).queued_behind, (o_dispatch).coalesced, "
    "(o_dispatch).answered_by, (o_dispatch).pinned_version, (o_dispatch).released_from, "
    "(o_dispatch).debounce_key, "
    "(o_dispatch).concurrency_key, (o_dispatch).concurrency_limit, (o_dispatch).fair_tag",
    "",
).replace("claim_next_read(%s, %s, %s, %s, %s)", "claim_next_read(%s, %s, %s)")
assert _V10_CLAIM_NEXT != _CLAIM_NEXT


async def _enqueue(store: PostgresStore, *specs: tuple[str, str, int, str | None]) -> None:
    for did, tid, priority, tenant in specs:
        await store.enqueue(
            Dispatch(dispatch_id=did, thread_id=tid, kind="start", priority=priority, tenant=tenant)
        )


async def test_one_call_grants_one_lease_per_thread_in_claim_order_with_each_threads_read(
    pg_databases: Databases,
) -> None:
    store = await open_test_store(await pg_databases.clone())
    try:
        await _history(store, "t0", with_write=False)
        await _history(store, "t2", with_write=True)
        await _enqueue(
            store,
            ("d-a1", "t0", 0, None),
            ("d-a2", "t0", 0, None),  # the thread's second dispatch waits for the first
            ("d-b", "t1", 0, None),
            ("d-c", "t2", 5, None),  # first by priority
            ("d-d", "t3", 0, "acme"),  # the lease fixes the fresh thread's tenant
            ("d-e", "t4", 0, None),
        )
        leases = await store.claim_next("w", 60, limit=10)
        # priority first, then fair tags (issue 39): d-d, the first of tenant acme, starts
        # one place before the head (d-a1, of no tenant), whose d-b and d-e follow it
        assert [lease.dispatch.dispatch_id for lease in leases] == [
            "d-c", "d-d", "d-a1", "d-b", "d-e"
        ]  # fmt: skip
        for lease in leases:
            d = lease.dispatch
            assert d.status == "leased" and d.attempts == 1 and d.holder == "w"
            assert lease.claim.token == d.token and lease.claim.thread_id == d.thread_id
            # the snapshot the lease carries is what a read right after the grant returns
            assert lease.snapshot == await store.read(d.thread_id), d.dispatch_id
        by_thread = {lease.dispatch.thread_id: lease for lease in leases}
        assert by_thread["t2"].snapshot is not None
        assert by_thread["t2"].snapshot.version == 2 and len(by_thread["t2"].snapshot.writes) == 1
        assert by_thread["t3"].snapshot is not None and by_thread["t3"].snapshot.tenant == "acme"
        # nothing more while the threads are claimed; every lease's token fences its settle
        assert await store.claim_next("w2", 60, limit=10) == []
        for lease in leases:
            settled = await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
            assert settled.status == "done"
        [again] = await store.claim_next("w2", 60, limit=10)
        assert again.dispatch.dispatch_id == "d-a2"
        assert again.claim.token > by_thread["t0"].claim.token
    finally:
        await store.close()


async def test_a_thread_held_elsewhere_is_skipped_and_the_others_are_still_granted(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        await _enqueue(store, *((f"d{i}", f"t{i}", 0, None) for i in range(1, 6)))
        async with await psycopg.AsyncConnection.connect(dsn) as other:
            # another transaction holds t2's row (as a commit to it would)
            await other.execute("SELECT 1 FROM wakeful.threads WHERE thread_id = 't2' FOR UPDATE")
            leases = await store.claim_next("w", 60, limit=3)
            # t2 refused; the call still fills its limit from further down the queue
            assert [lease.dispatch.thread_id for lease in leases] == ["t1", "t3", "t4"]
            await other.rollback()
        rest = await store.claim_next("w", 60, limit=3)
        assert [lease.dispatch.thread_id for lease in rest] == ["t2", "t5"]
    finally:
        await store.close()


async def _lease_call(conn: psycopg.AsyncConnection[Any], limit: int) -> tuple[list[str], int]:
    """The dispatch ids one ``claim_next_read`` call leases (rolled back), and how many times
    it called the cursor ``claim_next`` (never since 0015: the fallback is in the call)."""
    async with conn.transaction(force_rollback=True):
        before = dict(await (await conn.execute(_CALLS)).fetchall())
        rows = await (
            await conn.execute(
                "SELECT (o_dispatch).dispatch_id"
                " FROM wakeful.claim_next_read('w', 60, %s, NULL, true)",
                (limit,),
            )
        ).fetchall()
        after = dict(await (await conn.execute(_CALLS)).fetchall())
    assert after["claim_next_read"] == before.get("claim_next_read", 0) + 1
    return [row[0] for row in rows], after.get("claim_next", 0) - before.get("claim_next", 0)


async def test_the_call_is_set_based_and_falls_back_only_when_a_candidate_was_refused(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        await _enqueue(store, ("d1", "t1", 0, None), ("d2", "t2", 0, None))
        # a second pending dispatch of t2: a resume (a start would wait queued)
        await store.enqueue(Dispatch(dispatch_id="d3", thread_id="t2", kind="resume"))
        await _enqueue(store, ("d4", "t3", 0, None), ("d5", "t4", 0, None))
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SET track_functions = 'pl'")
        # the first two candidates are on two threads: granted without claim_next()
        assert await _lease_call(conn, 2) == (["d1", "d2"], 0)
        # the first three hold t2 twice: the third lease comes from the fallback (since 0015
        # a loop in the call itself, not a call of the cursor claim_next)
        assert await _lease_call(conn, 3) == (["d1", "d2", "d4"], 0)
        # more room than work: every thread once, and the sources were exhausted
        assert await _lease_call(conn, 10) == (["d1", "d2", "d4", "d5"], 0)


async def test_concurrent_batch_leases_never_hold_one_thread_twice(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    stores = [await open_test_store(dsn) for _ in range(2)]
    try:
        await _enqueue(stores[0], *((f"d{i:03}", f"t{i % 12:02}", i % 3, None) for i in range(72)))
        held: dict[str, str] = {}
        settled: list[str] = []

        async def worker(store: PostgresStore, name: str) -> None:
            idle = 0
            while idle < 20:
                leases: list[Lease] = await store.claim_next(name, 60, limit=5)
                if not leases:
                    idle += 1
                    await asyncio.sleep(0.01)
                    continue
                idle = 0
                for lease in leases:
                    tid = lease.dispatch.thread_id
                    assert tid not in held, (tid, held[tid], name)
                    held[tid] = name
                for lease in leases:
                    await asyncio.sleep(0)
                    del held[lease.dispatch.thread_id]
                    await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
                    settled.append(lease.dispatch.dispatch_id)

        await asyncio.gather(*(worker(stores[i % 2], f"w{i}") for i in range(4)))
        assert sorted(settled) == [f"d{i:03}" for i in range(72)]
    finally:
        for store in stores:
            await store.close()


async def test_a_version_10_process_keeps_its_lease_call_across_migration_0011(
    pg_databases: Databases,
) -> None:
    """A fleet mid-upgrade: 0011 keeps claim_next_read's signature and result columns, so a
    process of the previous version, whose lease call is the same statement, keeps leasing
    (and gets the set-based body) while and after it is applied."""
    dsn = await pg_databases.clone()
    shipped = migrations.migrations()
    assert shipped[10][0] == 11 and len(shipped) >= 11
    signature = """
    SELECT pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
           p.proconfig
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'old' AND p.proname = 'claim_next_read'
    """
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier("old")))
        async with conn.transaction():
            for _, _, text in shipped[:10]:
                await conn.execute(render(text, conn, "old"))
            await conn.execute(
                "CREATE TABLE old.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, _ in shipped[:10]:
                await conn.execute(
                    "INSERT INTO old.schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
        version_10 = await (await conn.execute(signature)).fetchone()
        # a version-10 process enqueues and leases through its own statements
        for i in range(3):
            await conn.execute(
                f"SELECT old.enqueue('d{i}', 't{i}', 'start', '{{}}', 0, NULL, 5, NULL, NULL)"
            )
        lease_call = render(_V10_CLAIM_NEXT, conn, "old")
        first = await (await conn.execute(lease_call, ("old-w", 60.0, 1))).fetchall()
        store = await open_test_store(dsn, schema="old")  # migrates to 11
        try:
            version_11 = await (await conn.execute(signature)).fetchone()
            # the same statement after 0011: the set-based body (a generic plan) answers it
            after = await (await conn.execute(lease_call, ("old-w", 60.0, 5))).fetchall()
        finally:
            await store.close()
    assert version_10 is not None and version_11 is not None
    assert version_10[:2] == version_11[:2], "same arguments and result columns"
    assert "jit=off" in version_11[2] and "plan_cache_mode=force_generic_plan" in version_11[2]
    assert [row[0] for row in first] == ["d0"]
    assert [row[0] for row in after] == ["d1", "d2"]
    assert len(after[0]) == len(first[0])
