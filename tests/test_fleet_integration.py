"""Fleet integration: a keyed tool behind the remote hand survives a worker crash with one
effect; wake signals start work well before the polling floor; the relay killed at random
moments delivers every message exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from tests.runtime_support import eventually, store_url
from tests.services import nats_url, postgres_dsn
from wakeful import Commit, OutboxEntry, open_store
from wakeful.fleet import Registry, Worker, submit
from wakeful.runtime import START, Graph, append

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def wait_for(check: Callable[[], bool], what: str, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def child(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stderr=subprocess.PIPE)


def end(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=30)
    if proc.stderr:
        proc.stderr.close()


@pytest.mark.asyncio
async def test_a_keyed_tool_behind_the_hand_runs_its_effect_once_across_a_worker_crash(
    tmp_path: Path,
) -> None:
    url = store_url("sqlite", tmp_path)
    portfile = tmp_path / "port"
    hand = child("tests.hand_child", str(tmp_path / "ledger.db"), str(tmp_path), str(portfile))
    try:
        await asyncio.to_thread(wait_for, portfile.exists, "the hand to listen")
        hand_url = f"http://127.0.0.1:{portfile.read_text()}"
        async with open_store(url) as store:
            await submit(store, "t-pay", "payer", "charge me", dispatch_id="d-pay")
        first = child("tests.fleet_hand_child", url, str(tmp_path), hand_url, "first")
        try:
            await asyncio.to_thread(
                wait_for, (tmp_path / "answered-first").exists, "the hand to answer"
            )
        finally:
            await asyncio.to_thread(end, first)
        second = child("tests.fleet_hand_child", url, str(tmp_path), hand_url, "replacement")
        try:

            async def settled() -> bool:
                async with open_store(url) as store:
                    d = await store.get_dispatch("d-pay")
                    return d is not None and d.status == "done"

            await asyncio.to_thread(wait_for, lambda: asyncio.run(settled()), "recovery")
        finally:
            await asyncio.to_thread(end, second)
    finally:
        await asyncio.to_thread(end, hand, signal.SIGTERM)
    assert (tmp_path / "executions").read_text().split() == ["charge"], "one effect"
    assert (tmp_path / "answered-first").read_text() == (
        tmp_path / "answered-replacement"
    ).read_text()
    async with open_store(url) as store:
        messages = await store.messages("t-pay", 0, 100)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[-1].content == "Charged once."


class State(TypedDict):
    log: Annotated[list[str], append]


def quick_registry(started: dict[str, float], ran: asyncio.Event) -> Registry:
    async def node(state: dict[str, Any]) -> dict[str, Any]:
        started.setdefault("at", time.monotonic())
        ran.set()
        return {"log": ["ran"]}

    graph = Graph(State, name="quick").node("n", node).edge(START, "n").compile()
    return Registry().add("quick", graph)


async def started_within(tmp_path: Path, make_wake: Callable[[], Any]) -> float:
    started: dict[str, float] = {}
    ran = asyncio.Event()
    url = store_url("sqlite", tmp_path)
    async with open_store(url) as store:
        worker_wake, submit_wake = make_wake(), make_wake()
        worker = Worker(
            store,
            quick_registry(started, ran),
            concurrency=1,
            wake=worker_wake,
            poll_interval=5.0,
            relay=False,
        )
        running = asyncio.create_task(worker.run())
        await worker.started()
        listen = getattr(worker_wake, "listen", None)
        if listen is not None:
            await listen()
        await eventually(lambda: worker.stats.polls >= 1)  # next, the worker waits on the wake
        submitted = time.monotonic()
        await submit(store, "t", "quick", {}, dispatch_id="d", wake=submit_wake)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ran.wait(), 4.0)  # the polling floor is 5 s
        await worker.stop(2)
        await running
        await worker_wake.close()
        await submit_wake.close()
    assert "at" in started, "the run did not start before the polling floor"
    return started["at"] - submitted


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_a_postgres_notify_starts_work_well_before_the_polling_floor(tmp_path: Path) -> None:
    from wakeful.fleet.pgwake import PostgresWake

    dsn = postgres_dsn()
    latency = await started_within(tmp_path, lambda: PostgresWake(dsn, channel="wakeful_test_wake"))
    assert latency < 0.5, f"{latency:.3f} s"


@pytest.mark.asyncio
@pytest.mark.nats
async def test_a_nats_message_starts_work_well_before_the_polling_floor(tmp_path: Path) -> None:
    from wakeful.fleet.natswake import NatsWake

    url = nats_url()
    latency = await started_within(tmp_path, lambda: NatsWake(url, subject="wakeful.test.wake"))
    assert latency < 0.5, f"{latency:.3f} s"


def kill_relays_at_random(url: str, rounds: int) -> None:
    rng = random.Random(7)
    for _ in range(rounds):
        proc = subprocess.Popen([sys.executable, "-c", RELAY_CHILD, url], cwd=ROOT)
        time.sleep(rng.uniform(0.05, 0.4))  # a random moment to kill at, not a wait
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)


RELAY_CHILD = """
import asyncio, sys
from wakeful import open_store
async def main():
    store = await open_store(sys.argv[1])
    while True:
        await store.relay_outbox(1)
asyncio.run(main())
"""


@pytest.mark.asyncio
async def test_a_relay_killed_at_random_moments_delivers_each_message_once(tmp_path: Path) -> None:
    url = store_url("sqlite", tmp_path)
    async with open_store(url) as store:
        claim = await store.claim("t-a", "sender", 60)
        entries = tuple(
            OutboxEntry(message_id=f"m-{i}", target_thread="t-b", payload={"n": i})
            for i in range(60)
        )
        await store.commit("t-a", Commit(token=claim.token, outbox=entries))
    await asyncio.to_thread(kill_relays_at_random, url, 12)
    async with open_store(url) as store:
        while await store.relay_outbox(100):
            pass
        inbox = await store.inbox("t-b")
        assert sorted(m.message_id for m in inbox) == sorted(f"m-{i}" for i in range(60))
        assert [m.revision for m in inbox] == list(range(1, 61)), "no duplicate appends"
        dispatches = [d for d in await store.list_dispatches(thread_id="t-b", limit=1000)]
        assert len(dispatches) == 60 and len({d.dispatch_id for d in dispatches}) == 60
