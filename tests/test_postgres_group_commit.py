"""PostgreSQL server work per dispatch (issue 22): group commit, HOT thread updates, and the
upgrade to schema version 6 under a running fleet."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from tests.postgres_support import Databases, open_test_store
from wakeful.errors import OperationConflict, StaleClaim, VersionConflict
from wakeful.records import Checkpoint, Commit, Dispatch, Done, EventDraft, Settle
from wakeful.store.postgres import migrations
from wakeful.store.postgres.connection import render
from wakeful.store.postgres.group import COMMIT_MANY, MAX_IN_FLIGHT, batch_params
from wakeful.store.postgres.threads import _commit_params
from wakeful.store.validate import encode_commit

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


def _checkpoint(cid: str, parent: str | None, tenant: str | None = None) -> Checkpoint:
    return Checkpoint(
        id=cid,
        parent=parent,
        run_id="r",
        status="running",
        state={"n": 1},
        created_at=datetime.now(UTC),
        tenant=tenant,
    )


async def test_concurrent_commits_are_grouped_and_each_keeps_its_own_outcome(
    pg_databases: Databases,
) -> None:
    store = await open_test_store(await pg_databases.clone(), pool_size=4)
    try:
        claims = [await store.claim(f"t{i}", "w", 60) for i in range(24)]
        replayed = Commit(
            token=claims[5].token, operation_id="op-5", events=(EventDraft(type="a"),)
        )
        first = await store.commit("t5", replayed)
        conflicting = Commit(
            token=claims[6].token, operation_id="op-6", events=(EventDraft(type="first"),)
        )
        await store.commit("t6", conflicting)

        def commit_of(i: int) -> Commit:
            if i == 5:
                return replayed  # a retry: its receipt again, nothing written twice
            if i == 6:  # the same operation id with another payload
                return Commit(
                    token=claims[6].token, operation_id="op-6", events=(EventDraft(type="b"),)
                )
            token = claims[i].token + (1 if i % 7 == 3 else 0)  # 3, 10, 17: stale
            expected = 7 if i == 8 else None  # a version conflict
            return Commit(
                token=token,
                expected_version=expected,
                checkpoint=_checkpoint(f"cp-{i}", None),
                events=(EventDraft(type="e", data={"i": i}), EventDraft(type="f")),
                operation_id=f"run-{i}:0",
                settle=None,
            )

        outcomes = await asyncio.gather(
            *(store.commit(f"t{i}", commit_of(i)) for i in range(24)), return_exceptions=True
        )
        group = store.group_commit
        # at most MAX_IN_FLIGHT went out alone before the rest queued behind them
        assert group.batches >= 1 and group.grouped >= 24 - MAX_IN_FLIGHT - 2
        for i, outcome in enumerate(outcomes):
            snap = await store.read(f"t{i}")
            assert snap is not None
            events = [e.data for e in await store.events_after(f"t{i}")]
            if i in (3, 10, 17):
                assert isinstance(outcome, StaleClaim)
            elif i == 8:
                assert isinstance(outcome, VersionConflict)
            elif i == 6:
                assert isinstance(outcome, OperationConflict)
            elif i == 5:
                assert outcome == first and len(events) == 1
            else:
                assert not isinstance(outcome, BaseException), outcome
                assert outcome.version == 1 and outcome.events == (1, 2)
                assert snap.checkpoint is not None and snap.checkpoint.id == f"cp-{i}"
                assert events == [{"i": i}, None]
                continue
            if i not in (5, 6):  # a refused commit wrote nothing
                assert snap.version == 0 and snap.checkpoint is None and events == []
    finally:
        await store.close()


async def test_commits_of_one_loop_turn_go_together_with_nothing_in_flight(
    pg_databases: Databases,
) -> None:
    """With no call in flight, the first commit does not go alone: the commits queued in the
    same turn of the event loop (runs woken by one event) go with it, as one commit_many
    call; a commit with nothing beside it still goes alone, as one commit() call."""
    store = await open_test_store(await pg_databases.clone(), pool_size=4)
    try:
        claims = [await store.claim(f"t{i}", "w", 60) for i in range(7)]
        group = store.group_commit
        assert (group.batches, group.grouped) == (0, 0)
        outcomes = await asyncio.gather(
            *(
                store.commit(f"t{i}", Commit(token=claims[i].token, events=(EventDraft(type="e"),)))
                for i in range(6)
            )
        )
        assert (group.batches, group.grouped) == (1, 6)
        assert [o.events for o in outcomes] == [(1,)] * 6
        alone = await store.commit(
            "t6", Commit(token=claims[6].token, checkpoint=_checkpoint("a", None))
        )
        assert alone.version == 1 and (group.batches, group.grouped) == (1, 6)
    finally:
        await store.close()


async def test_a_settling_commit_in_a_group_settles_and_ends_the_claim(
    pg_databases: Databases,
) -> None:
    store = await open_test_store(await pg_databases.clone(), pool_size=4)
    try:
        for i in range(8):
            await store.enqueue(Dispatch(dispatch_id=f"d{i}", thread_id=f"t{i}", kind="start"))
        leases = await store.claim_next("w", 60, limit=8)
        assert len(leases) == 8
        commits = [
            Commit(
                token=lease.claim.token + (1 if n == 2 else 0),  # one fenced
                checkpoint=_checkpoint(f"cp-{n}", None),
                settle=Settle(dispatch_id=lease.dispatch.dispatch_id, outcome=Done()),
            )
            for n, lease in enumerate(leases)
        ]
        outcomes = await asyncio.gather(
            *(
                store.commit(lease.dispatch.thread_id, c)
                for lease, c in zip(leases, commits, strict=True)
            ),
            return_exceptions=True,
        )
        assert store.group_commit.grouped >= 2
        for n, (lease, outcome) in enumerate(zip(leases, outcomes, strict=True)):
            d = await store.get_dispatch(lease.dispatch.dispatch_id)
            snap = await store.read(lease.dispatch.thread_id)
            assert d is not None and snap is not None
            if n == 2:
                assert isinstance(outcome, StaleClaim)
                assert d.status == "leased" and snap.claim is not None and snap.version == 0
            else:
                assert not isinstance(outcome, BaseException), outcome
                assert d.status == "done" and snap.claim is None and snap.version == 1
    finally:
        await store.close()


async def test_commit_many_fails_whole_on_an_error_that_is_not_a_refusal(
    pg_databases: Databases,
) -> None:
    """Only a refusal (SQLSTATE class WK) is reported in its row; any other error rolls the
    whole call back, so every commit in it fails as one call would (nothing is written)."""
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        await store.enqueue(Dispatch(dispatch_id="d1", thread_id="t1", kind="start"))
        (lease,) = await store.claim_next("w", 60)
        good = Commit(token=lease.claim.token, events=(EventDraft(type="kept?"),))
        other = await store.claim("t2", "w", 60)
        bad = Commit(
            token=other.token,
            events=(EventDraft(type="x"),),
            settle=Settle(dispatch_id="d1", outcome=Done()),
        )
        params = [
            ("t1", lease.claim.token, *_commit_params(encode_commit("t1", good))),
            ("t2", other.token, *_commit_params(encode_commit("t2", bad))),
        ]
        # commit 2 settles another thread's dispatch: a refusal, reported in its row
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            query = render(COMMIT_MANY, conn, "wakeful")
            rows = await (await conn.execute(query, batch_params(params))).fetchall()
            assert [row[-2] for row in rows] == [None, "WK004"]
            assert [e.type for e in await store.events_after("t1")] == ["kept?"]
            assert await store.events_after("t2") == []
            # a status the table's CHECK refuses: not a refusal, the whole call fails
            broken = list(params[0])
            broken[-4] = "d1"  # settle d1 ...
            broken[-3] = "bogus"  # ... to a status no dispatch may have
            retry = Commit(token=other.token, events=(EventDraft(type="y"),))
            with pytest.raises(psycopg.errors.CheckViolation):
                await conn.execute(
                    query,
                    batch_params(
                        [("t2", other.token, *_commit_params(encode_commit("t2", retry))), broken]
                    ),
                )
        assert await store.events_after("t2") == []
        assert [e.type for e in await store.events_after("t1")] == ["kept?"]
    finally:
        await store.close()


async def _thread_updates(dsn: str, count: int) -> tuple[int, int]:
    """(updates, HOT updates) of the threads table, once the statistics show ``count``
    updates (each session reports its own within about a second)."""
    deadline = time.monotonic() + 15
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            row = await (
                await conn.execute(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                    " WHERE schemaname = 'wakeful' AND relname = 'threads'"
                )
            ).fetchone()
            assert row is not None
            if int(row[0]) >= count:
                assert int(row[0]) == count
                return int(row[0]), int(row[1])
            assert time.monotonic() < deadline, f"statistics show {row[0]} of {count} updates"
            await asyncio.sleep(0.1)
            await conn.execute("SELECT pg_stat_clear_snapshot()")


async def test_claims_commits_and_settles_of_a_listed_thread_are_hot_updates(
    pg_databases: Databases,
) -> None:
    """No indexed column of threads changes on a claim, commit or settle of a thread that
    has committed before, so PostgreSQL rewrites the row without touching an index."""
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        claim = await store.claim("t", "w", 60, tenant="acme")
        first = Commit(token=claim.token, checkpoint=_checkpoint("c0", None, "acme"), release=True)
        await store.commit("t", first)
        before = await _thread_updates(dsn, 2)  # the claim, the first commit (not HOT)
        parent = "c0"
        for n in range(1, 4):
            await store.enqueue(Dispatch(dispatch_id=f"d{n}", thread_id="t", kind="start"))
            (lease,) = await store.claim_next("w", 60)  # each step: one update of the row
            token = lease.claim.token
            await store.renew("t", token, 60)
            cp = _checkpoint(f"c{n}", parent, "acme")
            await store.commit("t", Commit(token=token, checkpoint=cp))
            parent = cp.id
            done = Settle(dispatch_id=lease.dispatch.dispatch_id, outcome=Done())
            await store.commit(
                "t", Commit(token=token, events=(EventDraft(type="e"),), settle=done)
            )
        after = await _thread_updates(dsn, 2 + 3 * 4)
        assert after[1] - before[1] == after[0] - before[0]  # every one of them HOT
    finally:
        await store.close()


async def test_version_6_keeps_every_function_a_running_version_5_process_calls(
    pg_databases: Databases,
) -> None:
    """A fleet mid-upgrade: processes of the previous version keep calling the functions
    they know, with the signatures they know, after migration 0006 is applied; and the data
    written before it (a listed thread, a deduplicated dispatch) reads the same after."""
    dsn = await pg_databases.clone()
    shipped = migrations.migrations()
    assert shipped[5][0] == 6
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier("old")))
        async with conn.transaction():
            for _, _, text in shipped[:5]:
                await conn.execute(render(text, conn, "old"))
            await conn.execute(
                "CREATE TABLE old.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, _ in shipped[:5]:
                await conn.execute(
                    "INSERT INTO old.schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )

        async def functions() -> set[tuple[str, str, str]]:
            rows = await (
                await conn.execute(
                    "SELECT p.proname, pg_get_function_identity_arguments(p.oid),"
                    " pg_get_function_result(p.oid) FROM pg_proc p"
                    " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'old'"
                )
            ).fetchall()
            return {(str(a), str(b), str(c)) for a, b, c in rows}

        version_5 = await functions()
    try:
        store = await open_test_store(dsn, schema="old", migrate=False)
    except migrations.SchemaVersionError:
        pass  # expected: this wakeful needs version 6
    else:
        await store.close()
        pytest.fail("a version-5 schema was opened without migrating")
    # data written under version 5, through its own functions
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "SELECT old.enqueue('d1', 't1', 'start', '{}', 0, NULL, 5, 'key-1', NULL)"
        )
    store = await open_test_store(dsn, schema="old")  # migrates to 6 and on
    try:
        claim = await store.claim("t0", "w", 60)
        await store.commit("t0", Commit(token=claim.token, checkpoint=_checkpoint("c", None)))
        assert [t.thread_id for t in await store.list_threads()] == ["t0"]
        again = Dispatch(
            dispatch_id="d2", thread_id="t1", kind="start", payload={}, dedupe_key="key-1"
        )
        assert (await store.enqueue(again)).dispatch_id == "d1"
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            version_6 = await functions()
    finally:
        await store.close()
    assert version_5 <= version_6
    # 0007 added retire_worker (and kept register_worker's signature); 0008 the trigger
    # function that fills a checkpoint's run segment columns; 0009 commit_each (version 6's
    # commit_many, which the set-based one falls back to); 0013 checkpoint_page (a page of a
    # thread's history); 0014 busy threads: enqueue with a policy beside the old signature,
    # and its helpers (the admission trigger's function); 0016 take_limit and
    # reconcile_limit (rate limits); 0018 deploys: register_worker and claim_next_read with a
    # version beside the old signatures, release_pins, and the function of the trigger that
    # pins a resume; 0019 migrate_runs (an operator moves runs between versions)
    # 0020 fire_schedules and unfinished_runs (schedule ticks in batches); 0022 the
    # scheduled status: the due step, the trigger function that schedules a delayed retry,
    # and the debounced enqueue; 0023 concurrency keys: enqueue_keyed, the key triggers'
    # functions (gate_key, release_key, resume_key, fill_key), concurrency_use and fair_tag;
    # 0025 fire_prepared (schedule ticks prepared ahead, fired set-based)
    assert {name for name, _, _ in version_6 - version_5} == {
        "promote_due",
        "schedule_retry",
        "enqueue_debounced",
        "register_worker",
        "claim_next_read",
        "release_pins",
        "migrate_runs",
        "pin_resume",
        "commit_many",
        "retire_worker",
        "checkpoint_segment",
        "commit_each",
        "checkpoint_page",
        "enqueue",
        "slot_ahead",
        "admit_next",
        "fence_thread",
        "take_limit",
        "reconcile_limit",
        "fire_schedules",
        "unfinished_runs",
        "enqueue_keyed",
        "gate_key",
        "release_key",
        "resume_key",
        "fill_key",
        "concurrency_use",
        "fair_tag",
        "fire_prepared",
    }
