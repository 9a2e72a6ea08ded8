"""``/readyz`` and ``wakeful doctor`` report the server (issue 41): role (primary or
standby), replication when visible, the pooler found, and the clock skew between this host
and the server. Read on a private primary with a synchronous standby
(``tests/pgcluster.py``), then with the standby made asynchronous."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from tests.pgcluster import Node, require_binaries
from tests.server_support import running_api
from wakeful.cli import cli
from wakeful.store.postgres import open_postgres_store
from wakeful.store.postgres.serverinfo import build

pytestmark = [pytest.mark.postgres]


def doctor(url: str) -> dict[str, Any]:
    done = CliRunner().invoke(cli, ["doctor", "--store", url, "--json"])
    assert done.exit_code == 0, done.output
    return dict(json.loads(done.output))


def report(**changes: Any) -> Any:
    settings: dict[str, Any] = {
        "standby": False,
        "version": "15",
        "sync_names": "",
        "sync_commit": "on",
        "standbys": [],
        "receiver": None,
        "delay": None,
        "pooler": "none",
        "skew": 0.0,
        "round_trip": 0.001,
    }
    settings.update(changes)
    return build(**settings)


def test_the_replication_state_and_its_warnings() -> None:
    sync = [{"name": "s1", "sync_state": "sync"}]
    asynchronous = [{"name": "s1", "sync_state": "async"}]
    hidden = [{"name": None, "sync_state": None}]
    cases = {
        "none": report(),
        "synchronous": report(sync_names="*", standbys=sync),
        "asynchronous": report(standbys=asynchronous),
        "waiting": report(sync_names="*"),
        "unknown": report(sync_names="*", standbys=hidden),
        "standby": report(standby=True, receiver={"host": "h", "port": 1}),
    }
    assert {name: r.replication for name, r in cases.items()} == {n: n for n in cases}
    assert cases["none"].warnings == [] and cases["synchronous"].warnings == []
    assert "failover can lose" in cases["asynchronous"].warnings[0]
    assert "every commit waits" in cases["waiting"].warnings[0]
    assert cases["standby"].role == "standby" and "read-only" in cases["standby"].warnings[0]
    # synchronous_commit off or local: commits never wait for a standby
    assert report(sync_names="*", sync_commit="local", standbys=sync).replication == (
        "asynchronous"
    )
    skewed = report(skew=2.5)
    assert skewed.warnings == ["this host's clock is +2.500 s off the server's"]
    assert report(pooler="transaction").warnings[0].startswith("behind a transaction pooler")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Node, Node]]:
    require_binaries()
    primary = Node.init()
    standby: Node | None = None
    try:
        primary.start()
        standby = Node.standby_of(primary)
        standby.start()
        primary.wait_synchronous_standby()
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE agents")
            conn.execute("CREATE DATABASE empty")  # never migrated
        yield primary, standby
    finally:
        for node in (primary, standby):
            if node is not None:
                node.remove()


@pytest.mark.asyncio
async def test_the_primary_reports_its_synchronous_standby_in_readyz(
    pair: tuple[Node, Node],
) -> None:
    primary, _ = pair
    store = await open_postgres_store(primary.url("agents"), pool_size=2)
    try:
        found = await store.server_report()
        assert (found.role, found.replication, found.pooler) == (
            "primary",
            "synchronous",
            "none",
        ), found
        assert [s["sync_state"] for s in found.standbys] == ["sync"], found
        assert found.standbys[0]["state"] == "streaming", found
        assert abs(found.clock_skew) < 1.0 and found.warnings == [], found
        async with running_api(store) as api:
            ready = (await api.client(None).get("/readyz")).json()
        assert ready["status"] == "ok"
        assert (ready["server"]["role"], ready["server"]["replication"]) == (
            "primary",
            "synchronous",
        )
        await asyncio.to_thread(primary.set_synchronous, "")
        end = time.monotonic() + 30
        while (now_async := await store.server_report()).replication != "asynchronous":
            # the pooled session takes the reloaded setting after its own SIGHUP
            assert time.monotonic() < end, now_async
            await asyncio.sleep(0.05)
        assert "failover can lose" in now_async.warnings[0]
    finally:
        await asyncio.to_thread(primary.set_synchronous, "*")
        await store.close()


def test_doctor_reports_a_standby_and_where_it_receives_from(pair: tuple[Node, Node]) -> None:
    primary, standby = pair
    on_standby = doctor(standby.url("empty"))
    assert (on_standby["role"], on_standby["replication"]) == ("standby", "standby")
    assert on_standby["receiving_from"]["port"] == primary.port
    assert on_standby["receiving_from"]["status"] == "streaming"
    assert on_standby["pooler"] == "none" and abs(on_standby["clock_skew"]) < 1.0
    assert any("read-only" in w for w in on_standby["warnings"])
    assert any("run `wakeful migrate`" in w for w in on_standby["warnings"])
    on_primary = doctor(primary.url("empty"))
    assert (on_primary["role"], on_primary["schema_version"]) == ("primary", 0)
