"""Failover under a steady load (issue 41), shared by ``tests/test_postgres_failover.py`` and
``python -m benchmarks.failover``.

A private primary with a synchronous standby (``tests/pgcluster.py``); the store, the
workers' wakes and their stores, and an HTTP server (``run_server``) all use one multi-host
URL,
``postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/wakeful?target_session_attrs=read-write``.
Two worker processes (``tests/pgfleet_child.py``) run the ``ops`` agent; this process
submits a thread every ``interval`` seconds and commits to a ledger thread of its own,
retrying each with the same dispatch or operation id until acknowledged. Each round waits
for a synchronous standby, SIGKILLs the primary (postmaster and backends), promotes the
standby (``pg_promote``), lets it accept commits alone (``synchronous_standby_names = ''``,
the window documented in docs/postgres-store.md), rebuilds the old primary as its standby
with ``pg_basebackup`` and makes that standby synchronous again; the HTTP server's
``/readyz`` must then name a primary and its thread read show what was acknowledged, and a
model delta published by a worker on the live channel (``PostgresLive``) must reach this
process's subscription. Nobody restarts a worker, the server, the channel or the store. At
the end, what was acknowledged is checked against the last primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.pgcluster import Node
from tests.pgfleet_support import check_fleet, endings, spawn, stop, wait_for
from wakeful import open_store
from wakeful.errors import StoreUnavailable
from wakeful.fleet import submit
from wakeful.fleet.pglive import PostgresLive
from wakeful.records import Checkpoint, Commit, EventDraft
from wakeful.server.runner import run_server
from wakeful.store.contract import Store

DB = "wakeful_failover"


@dataclass
class Report:
    """What a run measured: seconds from each kill to the first commit on the new primary,
    and what was acknowledged."""

    kill_to_commit: list[float] = field(default_factory=list)
    acked: list[tuple[float, float]] = field(default_factory=list)
    """``time.monotonic()`` when the successful attempt of each acknowledged ledger commit
    was sent, and when its acknowledgement arrived."""
    kill_to_promoted: list[float] = field(default_factory=list)
    submitted: list[str] = field(default_factory=list)
    ledger: list[int] = field(default_factory=list)
    endings: dict[str, int] = field(default_factory=dict)
    worker_stats: list[dict[str, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "failovers": len(self.kill_to_commit),
            "kill_to_first_commit_s": [round(s, 3) for s in self.kill_to_commit],
            "kill_to_promoted_s": [round(s, 3) for s in self.kill_to_promoted],
            "runs_acknowledged": len(self.submitted),
            "ledger_commits_acknowledged": len(self.ledger),
            "endings": self.endings,
        }


def multi_host(a: Node, b: Node) -> str:
    return (
        f"postgresql://postgres@127.0.0.1:{a.port},127.0.0.1:{b.port}/{DB}"
        "?target_session_attrs=read-write&connect_timeout=2"
    )


def ledger_commit(token: int, version: int) -> Commit:
    return Commit(
        token=token,
        expected_version=version - 1,
        checkpoint=Checkpoint(
            id=f"ledger-{version}",
            parent=f"ledger-{version - 1}" if version > 1 else None,
            run_id="ledger",
            status="running",
            state={"v": version},
            created_at=datetime.now(UTC),
        ),
        events=(EventDraft(type="ledger", data={"v": version}),),
        operation_id=f"ledger-op-{version}",
    )


async def until_acknowledged(call: Any, stop_at: float, sent: list[float] | None = None) -> Any:
    """Run ``call()`` until it is acknowledged (same ids each time: the store's retry
    contract); a failover makes it ``StoreUnavailable`` for a while. ``sent`` gets the time
    the successful attempt was sent."""
    while True:
        try:
            attempt = time.monotonic()
            result = await call()
            if sent is not None:
                sent.append(attempt)
            return result
        except StoreUnavailable:
            if time.monotonic() > stop_at:
                raise
            await asyncio.sleep(0.05)


async def load(store: Store, report: Report, stopping: asyncio.Event, interval: float) -> None:
    """Submit a run every ``interval`` seconds and commit to the ledger thread between."""
    claim = await until_acknowledged(
        lambda: store.claim("ledger", "scenario", ttl=600), time.monotonic() + 60
    )
    n = 0
    while not stopping.is_set():
        n += 1
        thread = f"t{n:04d}"
        await until_acknowledged(
            lambda t=thread: submit(store, t, "ops", "charge", dispatch_id=f"d-{t}"),
            time.monotonic() + 60,
        )
        report.submitted.append(thread)
        sent: list[float] = []
        await until_acknowledged(
            lambda v=n: store.commit("ledger", ledger_commit(claim.token, v)),
            time.monotonic() + 60,
            sent,
        )
        report.ledger.append(n)
        report.acked.append((sent[0], time.monotonic()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), interval)


async def failover(primary: Node, standby: Node, report: Report) -> tuple[Node, Node]:
    """Kill ``primary``, promote ``standby``, rebuild the old primary as its standby."""
    await asyncio.to_thread(primary.wait_synchronous_standby)
    await asyncio.sleep(0.5)  # steady load on the synchronous pair
    started = time.monotonic()
    await asyncio.to_thread(primary.kill)
    dead = time.monotonic()  # every process of the old primary is gone
    await asyncio.to_thread(standby.promote)
    await asyncio.to_thread(standby.set_synchronous, "")
    report.kill_to_promoted.append(time.monotonic() - started)
    rebuilt = await asyncio.to_thread(Node.standby_of, standby, primary.root, primary.port)
    await asyncio.to_thread(rebuilt.start)
    await asyncio.to_thread(standby.set_synchronous, "*")
    await asyncio.to_thread(standby.wait_synchronous_standby)
    end = time.monotonic() + 30
    while not (after := [acked for sent, acked in report.acked if sent > dead]):
        assert time.monotonic() < end, "no commit was acknowledged by the new primary"
        await asyncio.sleep(0.02)
    # sent once the old primary was dead: acknowledged by the new one
    report.kill_to_commit.append(min(after) - started)
    return standby, rebuilt


async def run(directory: Path, rounds: int = 3, interval: float = 0.03) -> Report:
    report = Report()
    primary = await asyncio.to_thread(Node.init)
    standby: Node | None = None
    workers = []
    try:
        await asyncio.to_thread(primary.start)
        standby = await asyncio.to_thread(Node.standby_of, primary)
        await asyncio.to_thread(standby.start)
        await asyncio.to_thread(primary.wait_synchronous_standby)  # commits wait for it
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        url = multi_host(primary, standby)
        store = await open_store(url, pool_size=4, pool_timeout=5.0)
        try:
            workers = [spawn(url, url, f"w{i}", directory) for i in range(2)]
            await asyncio.to_thread(
                wait_for, lambda: all((directory / f"w{i}.up").exists() for i in range(2)), "up"
            )
            stopping = asyncio.Event()
            loading = asyncio.create_task(load(store, report, stopping, interval))
            live = PostgresLive(url)
            try:
                async with http_server(url) as http:
                    for i in range(rounds):
                        primary, standby = await failover(primary, standby, report)
                        assert not loading.done(), loading
                        await serves_from_the_new_primary(http, report)
                        await live_events_flow(store, live, f"live-{i}", report)
            finally:
                await live.close()
            await asyncio.sleep(0.5)
            stopping.set()
            await loading
            await settle(store, report, directory)
        finally:
            report.worker_stats = [await asyncio.to_thread(stop, w) for w in workers]
            await store.close()
        check_ledger(primary, report)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        for node in (primary, standby):
            if node is not None:
                await asyncio.to_thread(node.remove)
    return report


@contextlib.asynccontextmanager
async def http_server(url: str) -> AsyncIterator[httpx.AsyncClient]:
    """``wakeful serve`` in this process over the multi-host URL (development mode: no
    tokens, loopback only), with a client for it."""
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(
        run_server(
            url,
            port=0,
            log_level="warning",
            on_ready=lambda host, port: ready.set_result(port),
            stop=stop,
            store_options={"pool_size": 2, "pool_timeout": 5.0},
        )
    )
    try:
        port = await asyncio.wait_for(ready, 30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)


async def serves_from_the_new_primary(http: httpx.AsyncClient, report: Report) -> None:
    """The HTTP server, never restarted, answers from the promoted primary: ``/readyz``
    names a primary and the ledger thread reads at least what was acknowledged."""
    end = time.monotonic() + 30
    while True:
        ready = await http.get("/readyz")
        if ready.status_code == 200 and ready.json()["server"]["role"] == "primary":
            break
        assert time.monotonic() < end, f"the server did not recover: {ready.text[:300]}"
        await asyncio.sleep(0.1)
    acknowledged = len(report.ledger)
    thread = await http.get("/v1/threads/ledger")
    assert thread.status_code == 200, thread.text[:300]
    assert thread.json()["version"] >= acknowledged


async def live_events_flow(store: Store, live: PostgresLive, prefix: str, report: Report) -> None:
    """The live channel works again on both ends, never restarted: this process's
    subscription (its LISTEN reconnected) receives a model delta a worker published (its
    publisher reconnected) for a run submitted now. A delta sent before the subscription's
    connection was back is lost by design (a hint), so a new probe run goes every 2 s."""
    arrived = asyncio.Event()
    unsubscribes = []
    try:
        for n in range(15):
            thread = f"{prefix}-{n}"
            unsubscribes.append(await live.subscribe(thread, lambda _e: arrived.set()))
            await until_acknowledged(
                lambda t=thread: submit(store, t, "ops", "charge", dispatch_id=f"d-{t}"),
                time.monotonic() + 30,
            )
            report.submitted.append(thread)  # checked at the end like every run
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), 2.0)
            if arrived.is_set():
                return
        raise AssertionError("no live event arrived after the failover")
    finally:
        for unsubscribe in unsubscribes:
            await unsubscribe()


async def settle(store: Store, report: Report, directory: Path) -> None:
    """Wait for every acknowledged run to end, then check the fleet's promises."""
    end = time.monotonic() + 60
    while True:
        ended = await endings(store, report.submitted)
        if all(ended.values()):
            break
        assert time.monotonic() < end, "acknowledged runs did not end within 60 s"
        await asyncio.sleep(0.2)
    report.endings = await check_fleet(store, report.submitted, directory)


def check_ledger(primary: Node, report: Report) -> None:
    """Every acknowledged ledger commit is on the last primary, once."""
    with psycopg.connect(primary.url(DB), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT version, count(*) FROM wakeful.checkpoints WHERE thread_id = 'ledger'"
            " GROUP BY version ORDER BY version"
        ).fetchall()
        receipts = conn.execute(
            "SELECT count(*) FROM wakeful.receipts WHERE thread_id = 'ledger'"
        ).fetchone()
        submitted = conn.execute(
            "SELECT count(*) FROM wakeful.dispatches WHERE dispatch_id = ANY(%s)",
            ([f"d-{t}" for t in report.submitted],),
        ).fetchone()
    present = {int(v): int(n) for v, n in rows}
    lost = [v for v in report.ledger if present.get(v) != 1]
    assert lost == [], f"acknowledged ledger commits lost by a failover: {lost}"
    assert receipts is not None and receipts[0] >= len(report.ledger)
    assert submitted is not None and submitted[0] == len(report.submitted)
