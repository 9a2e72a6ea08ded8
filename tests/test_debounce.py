"""Debounce (issue 39 item 4) through its forms: ``wakeful.submit(debounce=)`` with a worker
(one run, with the last input), ``Registry.add(debounce=)`` and the ``debounce`` field over
HTTP, the client, and ``wakeful submit --debounce``. The store's part (one scheduled
dispatch per thread and key) is ``wakeful.testkit.time_cases``, on every store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio

from tests.cli_support import cli, error_line
from tests.server_support import ALPHA, Api, echo_graph, running_api
from wakeful import ManualClock, open_store
from wakeful.client import Client
from wakeful.errors import InvalidInput
from wakeful.fleet import Registry, Worker, submit
from wakeful.runtime import START, Graph, NodeContext, append
from wakeful.store.memory import MemoryStore

T0 = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)


class Seen(TypedDict):
    seen: Annotated[list[str], append]


def _graph() -> Any:
    async def note(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"seen": ["ran"]}

    return Graph(Seen, name="seen").node("n", note).edge(START, "n").compile()


async def _until(check: Any, seconds: float = 10.0) -> Any:
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        found = await check()
        if found:
            return found
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_burst_of_submissions_runs_once_with_the_last_input() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock)
    worker = Worker(store, Registry().add("seen", _graph()), poll_interval=0.01, clock=clock)
    running = asyncio.create_task(worker.run())
    try:
        ids = []
        for word in ("one", "two", "three"):
            d = await submit(store, "t1", "seen", {"seen": [word]}, debounce=2)
            assert d.status == "scheduled" and d.available_at == clock.now() + timedelta(seconds=2)
            ids.append(d.dispatch_id)
            clock.advance(1.5)  # within the window: the next one folds into it
        assert len(set(ids)) == 1
        await asyncio.sleep(0.05)  # polls at 1.5 s after the last: nothing may run yet
        assert await store.read("t1") is None
        clock.advance(0.5)

        async def completed() -> Any:
            snap = await store.read("t1")
            cp = snap.checkpoint if snap is not None else None
            return cp if cp is not None and cp.status == "completed" else None

        cp = await _until(completed)
        assert cp.state == {"seen": ["three", "ran"]} and cp.run_id == f"run-{ids[0]}"
        dispatches = await store.list_dispatches(thread_id="t1")
        assert [(d.dispatch_id, d.status) for d in dispatches] == [(ids[0], "done")]
        with pytest.raises(InvalidInput):
            await submit(store, "t1", "seen", {}, debounce=2, after=5)
        with pytest.raises(InvalidInput):
            await submit(store, "t1", "seen", {}, debounce=0)
    finally:
        await worker.stop()
        await running


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    store = MemoryStore(ManualClock(T0))
    echo = echo_graph()
    registry = Registry(default="echo").add("echo", echo, debounce=timedelta(seconds=30))
    registry.add("plain", echo)  # the same graph, not debounced
    async with running_api(store, registry=registry) as running:
        yield running


@pytest.mark.asyncio
async def test_http_and_client_debounce_by_the_registry_or_the_request(api: Api) -> None:
    alpha = api.client(ALPHA)
    first = await alpha.post(
        "/v1/threads/t1/runs", json={"target": "echo", "input": {"log": ["1"]}}
    )
    assert first.status_code == 202, first.text
    body = first.json()
    assert body["status"] == "scheduled"
    assert datetime.fromisoformat(body["not_before"]) == T0 + timedelta(seconds=30)
    again = await alpha.post(
        "/v1/threads/t1/runs", json={"target": "echo", "input": {"log": ["2"]}}
    )
    assert again.status_code == 202, again.text
    assert again.json()["dispatch_id"] == body["dispatch_id"]
    assert again.json()["run_id"] == body["run_id"] == f"run-{body['dispatch_id']}"
    listed = (await alpha.get("/v1/dispatches", params={"status": "scheduled"})).json()
    assert [(d["status"], d["payload"]["input"]) for d in listed["dispatches"]] == [
        ("scheduled", {"log": ["2"]})
    ]
    waiting = datetime.fromisoformat(listed["dispatches"][0]["not_before"])
    assert waiting == T0 + timedelta(seconds=30)
    # the request's own window wins; a target without one is not debounced
    async with Client(api.url, token=ALPHA) as client:
        own = await client.runs.create("t2", "plain", {"log": ["1"]}, debounce=timedelta(seconds=5))
        assert own["status"] == "scheduled"
        assert datetime.fromisoformat(own["not_before"]) == T0 + timedelta(seconds=5)
        folded = await client.runs.create("t2", "plain", {"log": ["2"]}, debounce=5)
        assert folded["dispatch_id"] == own["dispatch_id"]
        plain = await client.runs.create("t3", "plain", {"log": ["1"]})
        assert plain["status"] == "pending"
    for bad in (
        {"target": "echo", "debounce": 0},
        {"target": "echo", "debounce": -1},
        {"target": "echo", "debounce": 5, "after": 5},
        {"target": "echo", "debounce": None},
    ):
        r = await alpha.post("/v1/threads/t4/runs", json=bad)
        assert r.status_code == 422, (bad, r.text)


def test_cli_submit_debounce(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    first = cli("submit", "t1", "echo", "one", "--debounce", "1h", "--json", store=url)
    assert first.returncode == 0, first.stderr
    second = cli("submit", "t1", "echo", "two", "--debounce", "1h", "--json", store=url)
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["dispatch_id"] == b["dispatch_id"] and b["status"] == "scheduled"
    assert b["payload"]["input"] == "two"
    line = cli("submit", "t1", "echo", "three", "--debounce", "1h", store=url)
    assert line.returncode == 0 and f"submitted {a['dispatch_id']}" in line.stdout
    assert "scheduled for" in line.stdout

    async def count() -> int:
        async with open_store(url) as store:
            return len(await store.list_dispatches(thread_id="t1"))

    assert asyncio.run(count()) == 1
    bad = cli("submit", "t1", "echo", "x", "--debounce", "soon", store=url)
    assert bad.returncode == 6 and "debounce" in error_line(bad)
