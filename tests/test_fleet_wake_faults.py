"""Wakes under server faults: a frozen or killed NATS server (a private ``nats-server``), a
PostgreSQL server that stops answering (a TCP proxy the test freezes or black-holes; the
shared server is never frozen) or drops the connection (``pg_terminate_backend``), and a
worker's signals to itself, which never go through the wake.

Every notify returns within ``NOTIFY_BOUND`` (plus scheduling slack); a dead connection is
replaced and wakes flow again without waiting for the polling floor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import pytest
import pytest_asyncio

from tests.nats_server import PrivateNats
from tests.runtime_support import eventually
from tests.services import POSTGRES_HOST, POSTGRES_PORT, POSTGRES_USER, postgres_dsn
from tests.tcp_proxy import TcpProxy
from wakeful.fleet import NoWake, Registry, Worker, submit
from wakeful.fleet import pgwake as pgwake_module
from wakeful.fleet.natswake import NatsWake, deaf
from wakeful.fleet.pgwake import PostgresWake
from wakeful.fleet.wake import NOTIFY_BOUND
from wakeful.ids import new_id
from wakeful.runtime import START, Graph, NodeContext
from wakeful.store.memory import MemoryStore
from wakeful.store.postgres.listen import Listener
from wakeful.store.postgres.probe import PROBE_TIMEOUT

SLACK = 0.5
"""Scheduling slack on a shared, loaded machine, added to every bound checked here."""


async def timed_notify(wake: Any) -> float:
    started = time.monotonic()
    await wake.notify()
    return time.monotonic() - started


# --------------------------------------------------------------------------- nats


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[PrivateNats]:
    server = PrivateNats(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.asyncio
async def test_nats_notify_on_a_frozen_server_returns_within_the_bound(
    nats: PrivateNats,
) -> None:
    subject = f"wakeful.test.{new_id()}"
    async with NatsWake(nats.url, subject) as waiter, NatsWake(nats.url, subject) as notifier:
        await waiter.listen()
        await notifier.listen()
        nats.freeze()
        try:
            spent = [await timed_notify(w) for w in (notifier, waiter, notifier, waiter)]
        finally:
            nats.thaw()
        assert max(spent) < NOTIFY_BOUND + SLACK, spent
        await waiter.wait(0)  # what the freeze held back may arrive now: not counted
        woken = False
        deadline = time.monotonic() + 10
        while not woken and time.monotonic() < deadline:
            await notifier.notify()
            woken = await waiter.wait(0.5)
        assert woken, "wakes flow again after the thaw"


@pytest.mark.asyncio
async def test_nats_a_deaf_connection_is_replaced(
    nats: PrivateNats, caplog: pytest.LogCaptureFixture
) -> None:
    """The original failure: a flush that timed out while the server was frozen leaves a
    cancelled future; the late pong crashes nats-py's read loop, and the client goes on
    reporting itself connected while it receives nothing."""
    subject = f"wakeful.test.{new_id()}"
    async with NatsWake(nats.url, subject) as waiter, NatsWake(nats.url, subject) as notifier:
        await waiter.listen()
        client = waiter._client
        assert client is not None
        nats.freeze()
        try:
            with pytest.raises(Exception, match="flush timeout"):
                await client.flush(timeout=1)  # what notify() used to do
        finally:
            nats.thaw()
        with caplog.at_level(logging.CRITICAL, logger="nats.aio.client"):
            await eventually(lambda: deaf(client), 10)
        assert client.is_connected, "nats-py still believes it is connected"
        woken = False
        deadline = time.monotonic() + 3  # well before nats-py's own ping limit (~6 s)
        while not woken and time.monotonic() < deadline:
            await notifier.notify()
            woken = await waiter.wait(0.3)
        assert woken, "the next wait replaced the deaf connection"
        assert waiter.connections == 2
        assert waiter._client is not client


@pytest.mark.asyncio
async def test_nats_killed_and_restarted_degrades_to_polling_and_recovers(
    nats: PrivateNats,
) -> None:
    subject = f"wakeful.test.{new_id()}"
    async with NatsWake(nats.url, subject) as waiter, NatsWake(nats.url, subject) as notifier:
        await waiter.listen()
        await notifier.listen()
        nats.kill()
        spent = [await timed_notify(w) for w in (notifier, waiter, notifier)]
        assert max(spent) < NOTIFY_BOUND + SLACK, spent
        started = time.monotonic()
        assert await waiter.wait(0.3) is False
        assert time.monotonic() - started < 0.3 + SLACK
        nats.start()
        restarted = time.monotonic()
        woken = False
        while not woken and time.monotonic() - restarted < 10:
            await notifier.notify()
            woken = await waiter.wait(0.3)
        assert woken
        assert time.monotonic() - restarted < 5, "recovered at once, not after a poll backoff"


# --------------------------------------------------------------------------- postgres


@pytest_asyncio.fixture
async def proxy() -> AsyncIterator[TcpProxy]:
    postgres_dsn()  # skips loudly (or fails under WAKEFUL_REQUIRE_SERVICES=1)
    running = await TcpProxy(POSTGRES_HOST, POSTGRES_PORT).start()
    try:
        yield running
    finally:
        await running.close()


def proxied(proxy: TcpProxy) -> str:
    return f"postgresql://{POSTGRES_USER}@127.0.0.1:{proxy.port}/postgres"


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_postgres_wake_replaces_a_listening_connection_gone_silent(
    proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgwake_module, "HEALTH_INTERVAL", 0.3)
    channel = f"wake_{new_id()}"
    async with (
        PostgresWake(proxied(proxy), channel) as waiter,
        PostgresWake(postgres_dsn(), channel) as notifier,
    ):
        await waiter.listen()
        silenced = waiter.listener_pid
        proxy.blackhole()
        woken = False
        longest = 0.0
        deadline = time.monotonic() + 15
        while not woken and time.monotonic() < deadline:
            await notifier.notify()
            started = time.monotonic()
            woken = await waiter.wait(0.5)
            longest = max(longest, time.monotonic() - started)
        assert woken, "the silent connection was replaced and a notify wakes the wait"
        assert waiter.listener_pid not in (None, silenced)
        assert longest < 0.5 + PROBE_TIMEOUT + SLACK, longest


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_postgres_notify_through_a_frozen_server_returns_within_the_bound(
    proxy: TcpProxy,
) -> None:
    channel = f"wake_{new_id()}"
    async with (
        PostgresWake(postgres_dsn(), channel) as waiter,
        PostgresWake(proxied(proxy), channel) as notifier,
    ):
        await waiter.listen()
        await notifier.notify()
        assert await waiter.wait(10) is True
        proxy.freeze()
        thaw = asyncio.get_running_loop().call_later(4, proxy.thaw)
        try:
            spent = [await timed_notify(notifier) for _ in range(3)]
        finally:
            thaw.cancel()
            proxy.thaw()
        assert max(spent) < NOTIFY_BOUND + SLACK, spent
        woken = False
        deadline = time.monotonic() + 15
        while not woken and time.monotonic() < deadline:
            await notifier.notify()
            woken = await waiter.wait(0.5)
        assert woken, "notifies reach the server again after the thaw"


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["blackhole", "terminate"])
async def test_store_listener_reconnects_after_a_silent_or_dropped_connection(
    proxy: TcpProxy, fault: str
) -> None:
    channel = f"listen_{new_id()}"
    listener = Listener(proxied(proxy), channel, health_interval=0.3, probe_timeout=0.5)
    try:
        assert await listener.ready(10)
        assert listener.connects == 1
        waiter = listener.subscribe("t-1")
        if fault == "blackhole":
            proxy.blackhole()
        else:  # only this listener's backend: the server is shared
            async with await psycopg.AsyncConnection.connect(
                postgres_dsn(), autocommit=True
            ) as admin:
                cur = await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'wakeful-listen' AND client_port = ANY(%s)",
                    (proxy.upstream_ports(),),
                )
                assert [row[0] for row in await cur.fetchall()] == [True]
        await eventually(lambda: listener.connects == 2 and listener.listening, 10)
        assert waiter.done(), "a reconnect wakes every waiter to re-check"
        notified = listener.subscribe("t-1")
        async with await psycopg.AsyncConnection.connect(postgres_dsn(), autocommit=True) as conn:
            await conn.execute("SELECT pg_notify(%s, 't-1')", (channel,))
        await asyncio.wait_for(notified, 10)
    finally:
        await listener.close()


# --------------------------------------------------------------------------- the worker


class State(TypedDict, total=False):
    n: int


def quick_registry(finished: dict[str, float], seconds: float = 0.0) -> Registry:
    async def work(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        await asyncio.sleep(seconds)  # the work itself: a dispatch occupies its slot this long
        finished[ctx.run_id] = time.monotonic()
        return {"n": 1}

    g = Graph(State, name="quick")
    g.node("work", work)
    g.edge(START, "work")
    registry = Registry(default="quick")
    registry.add("quick", g.compile())
    return registry


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(worker.run())
    try:
        await worker.started()
        yield task
    finally:
        await worker.stop(grace=5)
        await asyncio.wait_for(task, 10)


@pytest.mark.asyncio
async def test_a_freed_slot_and_a_stop_reach_the_worker_without_the_wake() -> None:
    """The wake carries nothing here (``NoWake``) and the floor is 30 s: only the worker's
    local signals to itself can make it take the next dispatch, or stop, at once."""
    store = MemoryStore()
    finished: dict[str, float] = {}
    worker = Worker(store, quick_registry(finished), concurrency=1, wake=NoWake(), poll_interval=30)
    for i in range(3):
        await submit(store, f"t-{i}", "quick", {}, dispatch_id=f"d-{i}")
    started = time.monotonic()
    async with running(worker) as task:
        await eventually(lambda: len(finished) == 3, 10)
        assert worker.stats.claimed == 3
        stopping = time.monotonic()
        await worker.stop(grace=5)
        await asyncio.wait_for(task, 5)
        assert time.monotonic() - stopping < 2, "stop ended the 30 s wait locally"
    assert time.monotonic() - started < 10


# nats-py's reconnect attempt that times out against the frozen server drops its socket's
# writer without closing it (nats/aio/client.py, _attempt_reconnect); the garbage collector
# closes it, with this warning.
@pytest.mark.filterwarnings("ignore:unclosed <StreamWriter:ResourceWarning")
@pytest.mark.slow
@pytest.mark.asyncio
async def test_nats_frozen_for_10_s_during_a_200_dispatch_drain(nats: PrivateNats) -> None:
    """Two workers wake only through NATS (their polling floor is 30 s): a submit never
    blocks longer than the bound, and 5 s after SIGCONT dispatches run as fast as before.
    Each dispatch takes 0.3 s, so work is running when the server freezes and slots free up
    while it is frozen (a worker's signal to itself used to go through NATS and, on the
    thaw, leave the worker deaf)."""
    subject = f"wakeful.test.{new_id()}"
    store = MemoryStore()
    finished: dict[str, float] = {}
    registry = quick_registry(finished, 0.3)
    wakes = [NatsWake(nats.url, subject) for _ in range(3)]
    workers = [
        Worker(store, registry, concurrency=2, wake=wake, poll_interval=30, relay=False)
        for wake in wakes[:2]
    ]
    submitter = wakes[2]
    for wake in wakes:
        await wake.listen()
    submitted: dict[str, float] = {}
    blocked: list[float] = []
    loop = asyncio.get_running_loop()
    async with running(workers[0]), running(workers[1]):
        began = time.monotonic()
        freeze = loop.call_later(2, nats.freeze)
        thaw = loop.call_later(12, nats.thaw)
        try:
            for i in range(200):
                await asyncio.sleep(max(0.0, began + i * 0.1 - time.monotonic()))
                at = time.monotonic()
                await submit(store, f"t-{i}", "quick", {}, dispatch_id=f"d-{i}", wake=submitter)
                blocked.append(time.monotonic() - at)
                submitted[f"run-d-{i}"] = at
            await eventually(lambda: len(finished) == 200, 45)
        finally:
            freeze.cancel()
            thaw.cancel()
            if nats.proc is not None and nats.proc.poll() is None:
                nats.thaw()
    for wake in wakes:
        await wake.close()
    thawed = began + 12
    late = {run: finished[run] - at for run, at in submitted.items() if at >= thawed + 5}
    before = [finished[run] - at for run, at in submitted.items() if at < began + 2]
    assert max(blocked) < NOTIFY_BOUND + SLACK, max(blocked)
    during = [finished[run] - at for run, at in submitted.items() if at >= thawed]
    assert len(late) >= 25
    assert max(late.values()) < 2.3, sorted(late.values())[-5:]
    assert sorted(before)[len(before) // 2] < 1.3, "the normal latency before the freeze"
    assert during  # measured: dispatches submitted in the first 5 s after SIGCONT
