"""LangGraph graphs run by ``wakeful worker`` processes behind the LangGraph API (issue 44,
decision 0052), driven by the official ``langgraph-sdk`` against a real uvicorn server on
loopback (``create_app(..., langgraph_runs="workers")``), on a SQLite file and on
PostgreSQL; the workers publish LangGraph's chunks on a PostgreSQL live channel.

Streams (values, updates, messages-tuple), ``runs.wait``, an ``interrupt()`` answered with
``Command(resume=...)``, ``multitask_strategy`` ``reject`` and ``interrupt``, and the
acceptance: a worker SIGKILLed mid-stream, the client joining again with ``Last-Event-ID``
gets the run's final ``values`` once, and the thread ends as an uninterrupted run does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from langgraph_sdk import get_client

from tests.langgraph_fleet_app import registry
from tests.postgres_support import Databases
from tests.runtime_support import eventually
from tests.server_support import serving
from wakeful import open_store
from wakeful.fleet.pglive import PostgresLive
from wakeful.records import Dispatch
from wakeful.server import create_app
from wakeful.server.langgraph_api import close_langgraph
from wakeful.server.langgraph_runs import run_status

pytest_plugins = ["tests.postgres_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "token-acme-1234"
TOKENS = {TOKEN: "acme"}
TTL = 3.0
"""The workers' lease: a SIGKILLed worker's run is taken over this long after its last renewal."""


class Fleet:
    """The server (in this process) and ``wakeful worker`` processes over one store."""

    def __init__(self, store_url: str, live_url: str, directory: Path) -> None:
        self.store_url = store_url
        self.live_url = live_url
        self.directory = directory
        self.url = ""
        self.store: Any = None
        self.workers: dict[str, subprocess.Popen[str]] = {}

    def sdk(self) -> Any:
        return get_client(url=self.url, headers={"Authorization": f"Bearer {TOKEN}"})

    async def worker(self, worker_id: str) -> subprocess.Popen[str]:
        """Start a worker process and wait until it has registered."""
        args = [str(Path(sys.executable).parent / "wakeful"), "worker"]
        args += ["--store", self.store_url, "--app", "tests.langgraph_fleet_app:registry"]
        args += ["--worker-id", worker_id, "--ttl", str(TTL), "--poll", "0.05", "--grace", "2"]
        args += ["--live", "postgres", "--live-url", self.live_url, "--json"]
        child = self.workers[worker_id] = self._spawn(args, worker_id, {})

        async def registered() -> bool:
            assert child.poll() is None, (self.directory / f"{worker_id}.log").read_text()
            return worker_id in {w.worker_id for w in await self.store.list_workers()}

        await eventually(registered, deadline=60)
        return child

    def _spawn(self, args: list[str], name: str, extra: dict[str, str]) -> subprocess.Popen[str]:
        """A ``wakeful`` process of this worktree; its stderr goes to ``<name>.log``."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        env.update(extra)
        with (self.directory / f"{name}.log").open("w") as log:  # the child's own copy
            return subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
            )

    def stop(self, worker_id: str) -> dict[str, Any]:
        """SIGTERM a worker; the stats it printed."""
        child = self.workers.pop(worker_id)
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0, (self.directory / f"{worker_id}.log").read_text()[-3000:]
        stats: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return stats

    def kill(self, worker_id: str) -> None:
        child = self.workers.pop(worker_id)
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)

    def calls(self) -> list[str]:
        path = self.directory / "calls.txt"
        return path.read_text().split() if path.exists() else []


@asynccontextmanager
async def running(store_url: str, live_url: str, directory: Path) -> AsyncIterator[Fleet]:
    fleet = Fleet(store_url, live_url, directory)
    fleet.store = await open_store(store_url)
    live = PostgresLive(live_url)
    app = create_app(fleet.store, registry(), TOKENS, live=live, langgraph_runs="workers")
    try:
        async with serving(app) as url:
            fleet.url = f"{url}/langgraph"
            yield fleet
    finally:
        for child in fleet.workers.values():
            if child.poll() is None:
                child.kill()
            child.communicate(timeout=30)
        await close_langgraph(app)
        await live.close()
        await fleet.store.close()


def test_run_status_of_a_dispatch() -> None:
    def run(**fields: Any) -> Dispatch:
        return Dispatch(dispatch_id="r", thread_id="t", kind="start", **fields)

    statuses = ("queued", "scheduled", "pending", "leased", "awaiting", "done", "quarantined")
    assert [run_status(run(status=s), failed=False) for s in statuses] == [
        "pending", "pending", "pending", "running", "interrupted", "success", "error",
    ]  # fmt: skip
    assert run_status(run(status="done"), failed=True) == "error"
    assert run_status(run(status="done", last_error="cancelled: x"), failed=False) == "interrupted"
    assert run_status(run(status="done", attempts=6, max_attempts=5), failed=False) == "error"


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def fleet(
    request: pytest.FixtureRequest, tmp_path: Path, pg_databases: Databases
) -> AsyncIterator[Fleet]:
    live_url = await pg_databases.clone()
    store_url = f"sqlite:///{tmp_path / 'store.db'}" if request.param == "sqlite" else live_url
    async with running(store_url, live_url, tmp_path) as started:
        yield started


async def raw_tickets(fleet: Fleet, thread_id: str) -> list[Any]:
    """The open tickets the HTTP API lists for a thread."""
    v1 = fleet.url.removesuffix("/langgraph") + "/v1"
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as raw:
        tickets: list[Any] = (await raw.get(f"{v1}/threads/{thread_id}")).json()["tickets"]
        return tickets


def gated(fleet: Fleet, name: str) -> dict[str, Any]:
    """The input of a ``gated`` run waiting at node ``two`` for the file ``name``."""
    return {"log": [], "gate": str(fleet.directory / name)}


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_stream_wait_interrupt_resume_and_messages(fleet: Fleet) -> None:
    await fleet.worker("w-1")
    sdk = fleet.sdk()
    try:
        thread = (await sdk.threads.create())["thread_id"]
        (fleet.directory / "open").write_text("")
        parts = [
            part
            async for part in sdk.runs.stream(
                thread,
                "gated",
                input=gated(fleet, "open"),
                stream_mode=["values", "updates", "messages-tuple"],
            )
        ]
        assert [p.event for p in parts].count("metadata") == 1, "the SDK did not reconnect"
        run_id = parts[0].data["run_id"]
        updates = [p.data for p in parts if p.event == "updates"]
        assert updates == [
            {"one": {"log": ["one"]}},
            {"two": {"log": ["two"]}},
            {"three": {"log": ["three"]}},
        ]
        values = [p.data["log"] for p in parts if p.event == "values"]
        assert values == [[], ["one"], ["one", "two"], ["one", "two", "three"]]
        stored = await fleet.store.get_dispatch(run_id)  # the run is a durable dispatch
        assert stored is not None and stored.status == "done"
        run = await sdk.runs.get(thread, run_id)
        assert (run["run_id"], run["status"]) == (run_id, "success")
        assert (await sdk.runs.join(thread, run_id))["log"] == ["one", "two", "three"]
        seen_all = [
            p.event async for p in sdk.runs.join_stream(thread, run_id, last_event_id="end")
        ]
        assert seen_all == ["metadata"], "a client that saw the end gets nothing more"

        asked = (await sdk.threads.create())["thread_id"]
        waited = await sdk.runs.wait(asked, "approval", input={"log": []})
        assert waited["__interrupt__"][0]["value"] == "ship it?"
        state = await sdk.threads.get_state(asked)
        assert (
            state["next"] == ["ask"] and state["tasks"][0]["interrupts"][0]["value"] == "ship it?"
        )
        [suspended] = await sdk.runs.list(asked)
        assert suspended["status"] == "interrupted"
        assert (await fleet.store.get_dispatch(suspended["run_id"])).status == "awaiting"
        answered = await sdk.runs.wait(asked, "approval", command={"resume": "yes"})
        assert answered == {"log": ["answer:yes"]}
        statuses = [r["status"] for r in await sdk.runs.list(asked)]
        assert statuses == ["success", "success"]  # newest first; the suspended one was answered

        # the interrupt is a wakeful ticket: the HTTP API lists it and answers it
        ticketed = (await sdk.threads.create())["thread_id"]
        await sdk.runs.wait(ticketed, "approval", input={"log": []})
        v1 = fleet.url.removesuffix("/langgraph") + "/v1"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(headers=auth) as raw:
            [ticket] = (await raw.get(f"{v1}/threads/{ticketed}")).json()["tickets"]
            assert ticket["question"] == "ship it?"
            answer = {"answers": {ticket["id"]: "via v1"}}
            resumed = await raw.post(f"{v1}/threads/{ticketed}/resume", json=answer)
            assert resumed.status_code == 202, resumed.text

        async def answered_via_v1() -> bool:
            state = await sdk.threads.get_state(ticketed)
            return bool(state["values"]["log"] == ["answer:via v1"])

        await eventually(answered_via_v1, deadline=60)
        assert (await raw_tickets(fleet, ticketed)) == []

        broken = (await sdk.threads.create())["thread_id"]
        failed = [p async for p in sdk.runs.stream(broken, "broken", input={"log": []})]
        assert failed[-1].event == "error" and "the node failed" in failed[-1].data["message"]
        [run] = await sdk.runs.list(broken)
        assert run["status"] == "error"  # the failure is in the thread's checkpoint
        assert (await fleet.store.get_dispatch(run["run_id"])).attempts == 1, "not retried"

        chat = (await sdk.threads.create())["thread_id"]
        chunks = [
            part.data
            async for part in sdk.runs.stream(
                chat,
                "chat",
                input={"messages": [{"role": "user", "content": "hi"}]},
                stream_mode="messages-tuple",
            )
            if part.event == "messages"
        ]
        assert "".join(message["content"] for message, _ in chunks) == "hello from a worker"
    finally:
        await sdk.aclose()
    assert fleet.stop("w-1")["fenced"] == 0


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_multitask_reject_interrupt_and_rollback(fleet: Fleet) -> None:
    await fleet.worker("w-1")
    sdk = fleet.sdk()
    try:
        thread = (await sdk.threads.create())["thread_id"]
        first = await sdk.runs.create(thread, "gated", input=gated(fleet, "gate-a"))
        await eventually(lambda: fleet.calls() == ["one", "two"], deadline=60)

        with pytest.raises(httpx.HTTPStatusError) as refused:
            await sdk.runs.create(thread, "gated", input=gated(fleet, "open"))
        assert refused.value.response.status_code == 409  # reject is the default strategy

        (fleet.directory / "open").write_text("")
        second = await sdk.runs.create(
            thread, "gated", input=gated(fleet, "open"), multitask_strategy="interrupt"
        )
        final = await sdk.runs.join(thread, second["run_id"])
        # the second run continues the thread from the first run's last checkpoint
        assert final["log"] == ["one", "one", "two", "three"]
        assert (await sdk.runs.get(thread, first["run_id"]))["status"] == "interrupted"
        assert (await sdk.runs.get(thread, second["run_id"]))["status"] == "success"

        # rollback: the busy run's checkpoints go, the new run starts from an empty thread
        undone = (await sdk.threads.create())["thread_id"]
        await sdk.runs.create(undone, "gated", input=gated(fleet, "gate-b"))
        await eventually(lambda: fleet.calls().count("two") == 3, deadline=60)
        third = await sdk.runs.create(
            undone, "gated", input=gated(fleet, "open"), multitask_strategy="rollback"
        )
        assert (await sdk.runs.join(undone, third["run_id"]))["log"] == ["one", "two", "three"]
        history = await sdk.threads.get_history(undone, limit=100)
        assert {h["metadata"]["run_id"] for h in history} == {third["run_id"]}

        # runs.cancel: the run is fenced where it is and ends interrupted
        stopped = (await sdk.threads.create())["thread_id"]
        fourth = await sdk.runs.create(stopped, "gated", input=gated(fleet, "gate-c"))
        await eventually(lambda: fleet.calls().count("two") == 5, deadline=60)
        queued = await sdk.runs.create(
            stopped, "gated", input=gated(fleet, "open"), multitask_strategy="enqueue"
        )
        assert (await sdk.runs.get(stopped, queued["run_id"]))["status"] == "pending"
        await sdk.runs.cancel(stopped, fourth["run_id"], wait=True)
        assert (await sdk.runs.get(stopped, fourth["run_id"]))["status"] == "interrupted"
        # the queued run starts once the cancel has freed the thread, from its checkpoint
        done = await sdk.runs.join(stopped, queued["run_id"])
        assert done["log"] == ["one", "one", "two", "three"]

        for gate in ("gate-a", "gate-b"):  # the interrupted runs' nodes return now
            (fleet.directory / gate).write_text("")
        stats = fleet.stop("w-1")  # the cancelled run still waits for gate-c: stopped after grace
        assert stats["fenced"] == 2, "their writes after the interrupt were refused"
        state = await sdk.threads.get_state(thread)
        assert state["values"]["log"] == ["one", "one", "two", "three"]
        assert fleet.calls().count("three") == 3  # the three runs that were not interrupted
    finally:
        await sdk.aclose()


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_worker_sigkilled_mid_stream_join_stream_gets_final_values_once(
    fleet: Fleet,
) -> None:
    await fleet.worker("w-1")
    sdk = fleet.sdk()
    try:
        thread = (await sdk.threads.create())["thread_id"]
        seen = []
        stream = sdk.runs.stream(
            thread, "gated", input=gated(fleet, "gate"), stream_mode=["values", "updates"]
        )
        async for part in stream:
            seen.append(part)
            if part.event == "updates" and "one" in part.data:
                break
        await stream.aclose()
        run_id, last_id = seen[0].data["run_id"], seen[-1].id
        await eventually(lambda: fleet.calls() == ["one", "two"], deadline=60)
        fleet.kill("w-1")  # in node two, after node one's checkpoint

        (fleet.directory / "gate").write_text("")
        await fleet.worker("w-2")
        joined = [
            part async for part in sdk.runs.join_stream(thread, run_id, last_event_id=last_id)
        ]
        final = {"log": ["one", "two", "three"], "gate": str(fleet.directory / "gate")}
        values = [p.data for p in joined if p.event == "values"]
        assert values.count(final) == 1 and values[-1] == final
        assert fleet.calls() == ["one", "two", "two", "three"], "one's write was kept"
        assert (await sdk.runs.get(thread, run_id))["status"] == "success"

        # the same input on another thread, nobody killed: the same state
        other = (await sdk.threads.create())["thread_id"]
        await sdk.runs.wait(other, "gated", input=gated(fleet, "gate"))
        killed, calm = await sdk.threads.get_state(thread), await sdk.threads.get_state(other)
        assert killed["values"] == calm["values"] == final
        assert killed["next"] == calm["next"] == []
    finally:
        await sdk.aclose()
    fleet.stop("w-2")


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_wakeful_serve_langgraph_runs_workers(
    tmp_path: Path, pg_databases: Databases
) -> None:
    """``wakeful serve --langgraph-runs workers`` and ``wakeful worker`` processes."""
    live_url = await pg_databases.clone()
    fleet = Fleet(f"sqlite:///{tmp_path / 'store.db'}", live_url, tmp_path)
    fleet.store = await open_store(fleet.store_url)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    args = [str(Path(sys.executable).parent / "wakeful"), "serve", "--store", fleet.store_url]
    args += ["--app", "tests.langgraph_fleet_app:registry", "--port", str(port)]
    args += ["--langgraph-runs", "workers", "--live", "postgres", "--live-url", live_url]
    server = fleet._spawn(args, "server", {"WAKEFUL_TOKENS": f"{TOKEN}=acme"})
    fleet.url = f"http://127.0.0.1:{port}/langgraph"
    try:
        async with httpx.AsyncClient() as raw:

            async def ready() -> bool:
                assert server.poll() is None, (tmp_path / "server.log").read_text()
                try:
                    return (await raw.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, deadline=60)
        await fleet.worker("w-1")
        sdk = fleet.sdk()
        try:
            thread = (await sdk.threads.create())["thread_id"]
            (tmp_path / "open").write_text("")
            parts = [
                part
                async for part in sdk.runs.stream(
                    thread, "gated", input=gated(fleet, "open"), stream_mode="updates"
                )
            ]
            assert [p.data for p in parts if p.event == "updates"] == [
                {"one": {"log": ["one"]}},
                {"two": {"log": ["two"]}},
                {"three": {"log": ["three"]}},
            ]
            run = await fleet.store.get_dispatch(parts[0].data["run_id"])
            assert run is not None and run.status == "done" and run.tenant == "acme"
        finally:
            await sdk.aclose()
        assert fleet.stop("w-1")["claimed"] == 1
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
        for child in fleet.workers.values():
            child.kill()
            child.communicate(timeout=30)
        await fleet.store.close()


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_a_plain_start_dispatch_runs_the_graph_on_its_thread(fleet: Fleet) -> None:
    # what a schedule's tick (a LangGraph cron) or POST /v1/threads/{id}/runs enqueues: a
    # start with the target and its input, no LangGraph run fields
    await fleet.worker("w-1")
    sdk = fleet.sdk()
    try:
        thread = (await sdk.threads.create())["thread_id"]
        plain = Dispatch(
            dispatch_id="d-plain-tick",
            thread_id=thread,
            kind="start",
            payload={"target": "gated", "input": gated(fleet, "open")},
            tenant="acme",
        )
        await fleet.store.enqueue(plain)
        await eventually(lambda: "one" in fleet.calls(), deadline=60)
        assert (await sdk.threads.get(thread))["status"] == "busy", "its run holds it"
        (fleet.directory / "open").write_text("")

        async def done() -> bool:
            stored: Dispatch | None = await fleet.store.get_dispatch("d-plain-tick")
            assert stored is not None and stored.status != "quarantined"
            return stored.status == "done"

        await eventually(done, deadline=60)
        state = await sdk.threads.get_state(thread)
        assert state["values"]["log"] == ["one", "two", "three"]
        assert fleet.calls().count("one") == 1
        assert (await sdk.threads.get(thread))["status"] == "idle"
    finally:
        await sdk.aclose()


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_after_seconds_delays_the_run_by_the_store_clock(fleet: Fleet) -> None:
    sdk = fleet.sdk()  # no worker: the run is only stored
    try:
        thread = (await sdk.threads.create())["thread_id"]
        run = await sdk.runs.create(thread, "gated", input=gated(fleet, "open"), after_seconds=90)
        stored = await fleet.store.get_dispatch(run["run_id"])
        assert stored is not None and stored.status == "scheduled"
        assert stored.available_at is not None and stored.created_at is not None
        delay = (stored.available_at - stored.created_at).total_seconds()
        assert 89 <= delay <= 91, delay
        assert (await sdk.runs.get(thread, run["run_id"]))["status"] == "pending"
        refused = await sdk.http.client.post(
            f"/threads/{thread}/runs",
            json={"assistant_id": "gated", "input": {}, "after_seconds": -1},
        )
        assert refused.status_code == 422, refused.text
    finally:
        await sdk.aclose()


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_debug_events_come_from_the_worker(fleet: Fleet) -> None:
    await fleet.worker("w-1")
    sdk = fleet.sdk()
    try:
        thread = (await sdk.threads.create())["thread_id"]
        (fleet.directory / "open").write_text("")
        parts = [
            (part.event, part.data)
            async for part in sdk.runs.stream(
                thread, "gated", input=gated(fleet, "open"), stream_mode="debug"
            )
        ]
        debug = [data for event, data in parts if event == "debug"]
        ran = [d["payload"]["name"] for d in debug if d["type"] == "task_result"]
        assert ran == ["one", "two", "three"], [d["type"] for d in debug]
    finally:
        await sdk.aclose()
