"""Opening the PostgreSQL store: migrations, schema names, pools, the server clock, errors
and retention running beside writers."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import psycopg_pool
import pytest
from psycopg import sql

from tests.postgres_support import Databases, dsn_for, open_test_store
from wakeful.errors import (
    InvalidInput,
    StoreClosed,
    StoreUnavailable,
    ThreadBusy,
    UnsupportedStore,
)
from wakeful.records import (
    Checkpoint,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    RetentionPolicy,
    Settle,
)
from wakeful.store import open_store
from wakeful.store.contract import Store
from wakeful.store.memory import MemoryStore
from wakeful.store.postgres import (
    PostgresStore,
    SchemaVersionError,
    connection,
    latest_version,
    migrate,
    migrations,
)
from wakeful.store.postgres.connection import render

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def _empty_database(dbs: Databases) -> str:
    """A fresh database with the wakeful schema dropped: nothing of wakeful in it."""
    dsn = await dbs.clone()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("DROP SCHEMA wakeful CASCADE")
    return dsn


async def _versions(dsn: str, schema: str = "wakeful") -> list[int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            sql.SQL("SELECT version FROM {}.schema_migrations ORDER BY version").format(
                sql.Identifier(schema)
            )
        )
        return [row[0] for row in await cur.fetchall()]


async def test_concurrent_migrations_apply_once(pg_databases: Databases) -> None:
    dsn = await _empty_database(pg_databases)
    results = await asyncio.gather(*(migrate(dsn) for _ in range(6)))
    assert results == [latest_version()] * 6
    assert await _versions(dsn) == list(range(1, latest_version() + 1))
    opened = await asyncio.gather(*(open_test_store(dsn) for _ in range(3)))
    for store in opened:
        await store.close()
    assert await _versions(dsn) == list(range(1, latest_version() + 1))


async def test_a_newer_schema_is_refused_and_left_alone(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("INSERT INTO wakeful.schema_migrations VALUES (999, 'future')")
    for attempt in (open_test_store(dsn), open_test_store(dsn, migrate=False), migrate(dsn)):
        with pytest.raises(SchemaVersionError, match="newer") as refused:
            await attempt
        assert "999" in str(refused.value) and "upgrade wakeful" in str(refused.value)
    assert (await _versions(dsn))[-1] == 999


async def test_a_version_1_database_upgrades_in_place(pg_databases: Databases) -> None:
    dsn = await _empty_database(pg_databases)
    _, name, text = migrations.migrations()[0]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async with conn.transaction():
            await conn.execute("CREATE SCHEMA wakeful")
            await conn.execute(render(text, conn, "wakeful"))
            await conn.execute(
                "CREATE TABLE wakeful.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            await conn.execute(
                "INSERT INTO wakeful.schema_migrations (version, name) VALUES (1, %s)", (name,)
            )
        # work in flight under version 1: a leased dispatch and its claim
        await conn.execute(
            "SELECT dispatch_id FROM wakeful.enqueue('d-1', 't1', 'start', '{}', 0, NULL, 5, NULL)"
        )
        cur = await conn.execute("SELECT token FROM wakeful.claim_next('w', 60, 1)")
        row = await cur.fetchone()
        assert row is not None
        token = row[0]
    with pytest.raises(SchemaVersionError, match="version 1"):
        await open_test_store(dsn, migrate=False)
    store = await open_test_store(dsn)
    try:
        assert await _versions(dsn) == list(range(1, latest_version() + 1))
        receipt = await store.commit(
            "t1",
            Commit(
                token=token,
                events=(EventDraft(type="done"),),
                settle=Settle(dispatch_id="d-1", outcome=Done()),
            ),
        )
        assert receipt.events == (1,)
        settled = await store.get_dispatch("d-1")
        assert settled is not None and settled.status == "done"
        snap = await store.read("t1")
        assert snap is not None and snap.claim is None
    finally:
        await store.close()


async def test_without_migrate_an_unmigrated_schema_is_refused(pg_databases: Databases) -> None:
    dsn = await _empty_database(pg_databases)
    with pytest.raises(SchemaVersionError, match="migrate"):
        await open_test_store(dsn, migrate=False)
    assert await migrate(dsn) == latest_version()
    store = await open_test_store(dsn, migrate=False)
    await store.close()


async def test_schemas_are_separate_namespaces(pg_databases: Databases) -> None:
    dsn = await _empty_database(pg_databases)
    alpha = await open_test_store(dsn, schema="alpha")
    beta = await open_test_store(dsn, schema="beta_2")
    try:
        claim = await alpha.claim("t1", "a", 30)
        assert await beta.read("t1") is None
        assert (await beta.claim("t1", "b", 30)).token == 1
        waiter = asyncio.create_task(beta.wait_events("t1", 0, timeout=0.5))
        await alpha.commit("t1", Commit(token=claim.token, events=(EventDraft(type="x"),)))
        assert await waiter == [], "a commit in another schema is not this schema's event"
        assert [e.type for e in await alpha.events_after("t1")] == ["x"]
    finally:
        await alpha.close()
        await beta.close()


@pytest.mark.parametrize("schema", ["Bad", "pg_catalog_x", "a-b", "1x", "x" * 49, ""])
async def test_invalid_schema_names_are_refused(schema: str) -> None:
    with pytest.raises(InvalidInput):
        await open_store(dsn_for("postgres"), schema=schema)
    with pytest.raises(InvalidInput):
        await migrate(dsn_for("postgres"), schema=schema)


async def test_a_pool_passed_in_is_used_and_not_closed(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[tuple[object, ...]]] = (
        psycopg_pool.AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
    )
    await pool.open(wait=True)
    try:
        store = await open_store(dsn, pool=pool)
        claim = await store.claim("t1", "h", 30)
        await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="x"),)))
        await store.close()
        with pytest.raises(StoreClosed):
            await store.read("t1")
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM wakeful.events")
            assert await cur.fetchone() == (1,)
    finally:
        await pool.close()


async def _backend_pids(store: PostgresStore, calls: int) -> list[int]:
    db = store._db  # the store's own pool, as every operation uses it
    return [(await db.fetchone("SELECT pg_backend_pid()", None))[0] for _ in range(calls)]


async def test_a_sequential_caller_keeps_the_warm_connection(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn, pool_size=4, pool_min_size=4)
    try:
        # each fresh connection goes out once (never handed out counts as idle too long)
        await _backend_pids(store, 4)
        # then the one used last, again and again
        assert len(set(await _backend_pids(store, 8))) == 1
    finally:
        await store.close()


async def test_a_connection_idle_too_long_goes_out_first(
    pg_databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn, pool_size=4, pool_min_size=4)
    try:
        await _backend_pids(store, 4)
        # every idle connection now counts as idle too long: round robin, oldest first
        monkeypatch.setattr(connection, "ROTATE_AFTER", -1.0)
        pids = await _backend_pids(store, 8)
        assert len(set(pids[:4])) == 4 and pids[4:] == pids[:4]
    finally:
        await store.close()


async def test_both_url_schemes_open_the_store(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    for url in (dsn, dsn.replace("postgresql://", "postgres://", 1)):
        async with open_store(url, pool_size=1) as store:
            assert isinstance(store, PostgresStore)
            assert await store.read("nothing") is None


async def test_an_unknown_option_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(UnsupportedStore, match="pool_size") as refused:
        await open_store(dsn_for("postgres"), pool_sise=3)
    assert "pool_sise" in str(refused.value)


async def test_an_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable) as refused:
        await open_store("postgresql://postgres@127.0.0.1:1/postgres", pool_timeout=1.0)
    assert refused.value.retryable


async def test_time_is_the_servers(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute("SELECT now()")
            row = await cur.fetchone()
            assert row is not None
            before = row[0]
        claim = await store.claim("t1", "h", 30)
        after = await store.clock_now()
        assert before + timedelta(seconds=30) <= claim.expires_at <= after + timedelta(seconds=30)
        assert claim.expires_at.utcoffset() == timedelta(0)
    finally:
        await store.close()


async def test_retention_runs_beside_writers(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn, pool_size=6)
    threads = [f"t-{i}" for i in range(12)]
    claims = {t: await store.claim(t, "writer", 120) for t in threads}
    latest: dict[str, str | None] = dict.fromkeys(threads)
    stop = asyncio.Event()

    async def write(thread_id: str) -> None:
        for i in range(30):
            cp = Checkpoint(
                id=f"{thread_id}-cp-{i}",
                parent=latest[thread_id],
                run_id="run-1",
                status="running",
                state={"i": i},
                created_at=claims[thread_id].expires_at,
            )
            await store.commit(
                thread_id,
                Commit(
                    token=claims[thread_id].token,
                    checkpoint=cp,
                    events=(EventDraft(type="step", data=i),),
                    operation_id=f"run-1:{i}",
                ),
            )
            latest[thread_id] = cp.id

    async def prune() -> int:
        rounds = 0
        while not stop.is_set():
            await store.prune(RetentionPolicy(keep_checkpoints=2, keep_events=3, receipt_max_age=0))
            rounds += 1
        return rounds

    try:
        pruning = asyncio.create_task(prune())
        await asyncio.gather(*(write(t) for t in threads))
        stop.set()
        assert await pruning > 0
        await store.prune(RetentionPolicy(keep_checkpoints=2, keep_events=3))
        for thread_id in threads:
            snap = await store.read(thread_id)
            assert snap is not None and snap.version == 30
            assert snap.checkpoint is not None and snap.checkpoint.id == latest[thread_id]
            history = await store.checkpoints(thread_id)
            assert [cp.id for cp, _ in history] == [f"{thread_id}-cp-29", f"{thread_id}-cp-28"]
            assert snap.event_floor == 28 and snap.last_seq == 30
            assert [e.data for e in await store.events_after(thread_id, 27)] == [27, 28, 29]
    finally:
        await store.close()


async def test_operations_on_a_closed_store_are_refused(pg_databases: Databases) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    await store.close()
    await store.close()
    with pytest.raises(StoreClosed):
        await store.claim("t1", "h", 30)
    with pytest.raises(StoreClosed):
        await store.wait_events("t1", 0, timeout=1)


async def _lapsed_leases_scenario(store: Store) -> list[list[str]]:
    for i in range(1, 5):
        await store.enqueue(Dispatch(dispatch_id=f"d{i}", thread_id=f"t{i}", kind="start"))
    leases = {lease.claim.thread_id: lease for lease in await store.claim_next("w", 60, 4)}
    await store.release("t1", leases["t1"].claim.token)  # released without settling
    await store.delete_thread("t2")  # its claim goes with it
    with pytest.raises(ThreadBusy):
        await store.claim("t4", "direct", 60)  # t4's lease is live
    rounds = [[lease.dispatch.dispatch_id for lease in await store.claim_next("w2", 60, 10)]]
    await store.settle("d3", leases["t3"].claim.token, Done())
    rounds.append([lease.dispatch.dispatch_id for lease in await store.claim_next("w3", 60, 10)])
    attempts = [d.attempts for d in await store.list_dispatches()]
    return [*rounds, [str(a) for a in attempts]]


async def test_leases_whose_claim_lapsed_are_claimable_as_in_the_reference(
    pg_databases: Databases,
) -> None:
    """Released and deleted claims free their leased dispatches at once, exactly as in the
    memory store; live leases and settled work are not offered again."""
    pg = await open_test_store(await pg_databases.clone())
    try:
        ours = await _lapsed_leases_scenario(pg)
    finally:
        await pg.close()
    reference = await _lapsed_leases_scenario(MemoryStore())
    assert ours == reference == [["d1", "d2"], [], ["2", "2", "1", "1"]]
