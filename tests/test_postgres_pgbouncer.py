"""wakeful behind PgBouncer in transaction pooling mode (issue 41): the store finds the
pooler when it opens and stops preparing statements (PgBouncer 1.18 does not track them),
listens through a direct URL (``wake_url``) or polls, and the whole conformance suite passes
through a PgBouncer this module starts in front of the shared server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

import tests.test_postgres_conformance as base
from tests.pgbouncer import PgBouncer
from tests.pgfleet_support import check_fleet, endings, spawn, stop, wait_for
from tests.postgres_support import (
    Databases,
    dsn_for,
    freeze_clock,
    open_test_store,
    reset_database,
)
from wakeful.cli import cli
from wakeful.clock import ManualClock
from wakeful.fleet import submit
from wakeful.records import Checkpoint, Commit, EventDraft
from wakeful.server.runner import run_server
from wakeful.store.contract import Store
from wakeful.store.postgres import PostgresStore, pooler

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    running = PgBouncer.start("transaction")
    try:
        yield running
    finally:
        running.stop()


def dbname(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


class TestPostgresStoreBehindPgBouncer(base.TestPostgresStore):
    """The conformance suite with every store call through PgBouncer (transaction mode),
    LISTEN through the server's own address."""

    @pytest.fixture(autouse=True)
    def _bouncer(self, bouncer: PgBouncer) -> None:
        self._bouncer_at = bouncer

    async def new_store(self, clock: ManualClock) -> Store:
        for dsn, stores in self._stores.items():
            if all(s.closed for s in stores):
                await reset_database(dsn)
                break
        else:
            direct = await self._dbs.clone()
            await freeze_clock(direct)
            # contract semantics, not durability (PgBouncer drops the startup options the
            # direct suite sets this with; a database default reaches every session)
            async with await psycopg.AsyncConnection.connect(direct, autocommit=True) as conn:
                await conn.execute(
                    sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(
                        sql.Identifier(dbname(direct))
                    )
                )
            dsn = self._bouncer_at.url(dbname(direct))
        return await self._open(dsn)

    async def _open(self, dsn: str) -> PostgresStore:
        store = await open_test_store(dsn, wake_url=dsn_for(dbname(dsn)))
        assert store.pooler is not None and store.pooler.mode == pooler.TRANSACTION
        self._stores.setdefault(dsn, []).append(store)
        return store


def commit(thread: str, token: int, version: int) -> Commit:
    """The ``version``-th checkpoint of ``thread`` with one event."""
    return Commit(
        token=token,
        expected_version=version - 1,
        checkpoint=Checkpoint(
            id=f"{thread}-cp{version}",
            parent=f"{thread}-cp{version - 1}" if version > 1 else None,
            run_id="run-1",
            status="running",
            state={"v": version},
            created_at=datetime.now(UTC),
        ),
        events=(EventDraft(type="step", data={"v": version}),),
        operation_id=f"op-{thread}-{version}",
    )


@pytest.mark.asyncio
async def test_opening_tells_direct_session_and_transaction_pooling_apart(
    pg_databases: Databases, bouncer: PgBouncer
) -> None:
    direct = await pg_databases.clone()
    name = dbname(direct)
    session = PgBouncer.start("session")
    try:
        found = {
            "direct": await pooler.detect(direct),
            "session": await pooler.detect(session.url(name)),
            "transaction": await pooler.detect(bouncer.url(name)),
        }
    finally:
        session.stop()
    assert {k: v.mode for k, v in found.items()} == {
        "direct": "none",
        "session": "session",
        "transaction": "transaction",
    }
    assert found["transaction"].connected_port == bouncer.port
    assert found["transaction"].server_port == 5432


@pytest.mark.asyncio
async def test_repeated_statements_through_the_pooler_are_never_prepared(
    pg_databases: Databases, bouncer: PgBouncer
) -> None:
    """psycopg prepares a statement on its fifth run; through PgBouncer 1.18 in transaction
    mode the next run lands on another server connection, where it does not exist. The store
    found the pooler and turned preparing off: many rounds of the same calls from many
    tasks all succeed. (With ``prepare_threshold=1`` forced, they fail: the check below.)"""
    url = bouncer.url(dbname(await pg_databases.clone()))
    store = await open_test_store(url, pool_size=4)
    try:

        async def thread(i: int) -> None:
            claim = await store.claim(f"t{i}", "w", ttl=30)
            for v in range(1, 9):
                await store.commit(f"t{i}", commit(f"t{i}", claim.token, v))
                assert (await store.read(f"t{i}")) is not None

        await asyncio.gather(*(thread(i) for i in range(8)))
        assert [(await store.read(f"t{i}")).version for i in range(8)] == [8] * 8  # type: ignore[union-attr]
    finally:
        await store.close()

    forced = await open_test_store(url, pool_size=4, prepare_threshold=1)
    try:
        with pytest.raises(psycopg.Error, match="prepared statement"):
            await asyncio.gather(*(forced.read(f"t{i % 8}") for i in range(64)))
    finally:
        await forced.close()


@pytest.mark.asyncio
async def test_behind_the_pooler_without_wake_url_waits_poll_and_with_it_they_wake(
    pg_databases: Databases, bouncer: PgBouncer
) -> None:
    direct = await pg_databases.clone()
    url = bouncer.url(dbname(direct))
    polling = await open_test_store(url, poll_interval=0.2)
    woken = await open_test_store(url, poll_interval=30, wake_url=direct)
    writer = await open_test_store(url)  # its NOTIFY goes through the pooler too
    try:
        assert not polling.listener.enabled and woken.listener.enabled
        claim = await writer.claim("t", "w", ttl=30)

        async def commit_later(version: int) -> None:
            await asyncio.sleep(0.3)
            await writer.commit("t", commit("t", claim.token, version))

        for store, version in ((polling, 1), (woken, 2)):
            started = time.monotonic()
            waiting = asyncio.create_task(store.wait_events("t", version - 1, timeout=20))
            await commit_later(version)
            events = await waiting
            assert [e.seq for e in events] == [version]
            assert time.monotonic() - started < 5, "woken by NOTIFY or the 0.2 s poll"
        assert woken.listener.connects == 1 and polling.listener.connects == 0
    finally:
        for store in (polling, woken, writer):
            await store.close()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_fleet_of_two_workers_through_the_pooler(
    pg_databases: Databases, bouncer: PgBouncer, tmp_path: Path
) -> None:
    """Two worker processes whose store calls all go through PgBouncer (transaction mode)
    and whose LISTEN goes to the server: every run ends once, completed, and the
    ``replay="never"`` tool ran once per run."""
    direct = await pg_databases.clone()
    url = bouncer.url(dbname(direct))
    threads = [f"t{i:03d}" for i in range(40)]
    workers = [spawn(url, direct, f"w{i}", tmp_path) for i in range(2)]
    try:
        await asyncio.to_thread(
            wait_for, lambda: all((tmp_path / f"w{i}.up").exists() for i in range(2)), "workers"
        )
        store = await open_test_store(url, wake_url=direct)
        try:
            for thread in threads:
                await submit(store, thread, "ops", "charge me", dispatch_id=f"d-{thread}")

            async def all_done() -> bool:
                found = await endings(store, threads)
                return all(found[t] for t in threads)

            deadline = time.monotonic() + 60
            while not await all_done():
                assert time.monotonic() < deadline, "the fleet did not finish in 60 s"
                await asyncio.sleep(0.1)
            assert await check_fleet(store, threads, tmp_path) == {"run.completed": 40}
            assert store.pooler is not None and store.pooler.mode == "transaction"
        finally:
            await store.close()
    finally:
        stats = [await asyncio.to_thread(stop, w) for w in workers]
    assert sum(s["done"] for s in stats) == 40
    assert all(s["done"] > 0 for s in stats), f"both workers took part: {stats}"


@pytest.mark.asyncio
async def test_doctor_and_readyz_report_the_transaction_pooler(
    pg_databases: Databases, bouncer: PgBouncer
) -> None:
    url = bouncer.url(dbname(await pg_databases.clone()))
    done = await asyncio.to_thread(CliRunner().invoke, cli, ["doctor", "--store", url, "--json"])
    assert done.exit_code == 0, done.output
    found = json.loads(done.output)
    assert (found["role"], found["pooler"]) == ("primary", "transaction")
    assert any("LISTEN needs a direct URL" in w for w in found["warnings"])
    # wakeful serve --wake-url: run_server's store listens on the server, and says so
    direct = dsn_for(dbname(url))
    polling = (await ready_of(url))["server"]
    listening = (await ready_of(url, wake_url=direct))["server"]
    assert polling["pooler"] == listening["pooler"] == "transaction"
    assert any("event waits poll" in w for w in polling["warnings"])
    assert listening["warnings"] == []


async def ready_of(url: str, **store_options: object) -> dict[str, Any]:
    """``/readyz`` of ``run_server`` over the store at ``url``."""
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(
        run_server(
            url,
            port=0,
            log_level="warning",
            on_ready=lambda host, port: ready.set_result(port),
            stop=stop,
            store_options=store_options,
        )
    )
    try:
        port = await asyncio.wait_for(ready, 20)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            return dict((await client.get("/readyz")).json())
    finally:
        stop.set()
        await asyncio.wait_for(serving, 20)
