"""Events over HTTP: JSON pages, and Server-Sent Events in order with ids, resumed with
``Last-Event-ID`` (also across a server restart on one SQLite file) with no gap and no
duplicate, keep-alives, 410 below the compaction floor, and a whole run driven through the
API by a real worker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tests.runtime_support import eventually
from tests.server_support import (
    ALPHA,
    STREAM,
    TOKENS,
    SSEReader,
    add_events,
    keyed,
    registry,
    running_api,
    seed_thread,
    serving,
)
from wakeful import open_store
from wakeful.errors import ReplayUnavailable
from wakeful.fleet import LocalWake, Worker
from wakeful.records import Event
from wakeful.runtime import ClaimPolicy
from wakeful.server.app import create_app
from wakeful.store.memory import MemoryStore


@pytest.mark.asyncio
async def test_events_page_in_order_by_seq() -> None:
    store = MemoryStore()
    await seed_thread(store, "t1", tenant="alpha", events=5)
    async with running_api(store) as api:
        alpha = api.client(ALPHA)
        first = (await alpha.get("/v1/threads/t1/events", params={"limit": 2})).json()
        assert [e["seq"] for e in first["events"]] == [1, 2] and first["next_after"] == 2
        assert first["events"][0]["type"] == "step" and first["events"][0]["data"] == {"i": 0}
        assert first["events"][0]["run_id"] == "run-1"
        rest = (await alpha.get("/v1/threads/t1/events", params={"after": 2})).json()
        assert [e["seq"] for e in rest["events"]] == [3, 4, 5] and rest["next_after"] == 5
        empty = (await alpha.get("/v1/threads/t1/events", params={"after": 5})).json()
        assert empty == {"events": [], "next_after": 5}


@pytest.mark.asyncio
async def test_a_stream_sends_stored_then_new_events_with_ids() -> None:
    store = MemoryStore()
    await seed_thread(store, "t1", tenant="alpha", events=3)
    async with (
        running_api(store) as api,
        api.client(ALPHA).stream("GET", "/v1/threads/t1/events", headers=STREAM) as response,
    ):
        assert response.headers["cache-control"] == "no-cache"
        reader = SSEReader(response)
        stored = await reader.events(3)
        assert [(f.id, f.event) for f in stored] == [(1, "step"), (2, "step"), (3, "step")]
        assert json.loads(stored[0].data)["data"] == {"i": 0}
        assert json.loads(stored[2].data)["seq"] == 3
        await add_events(store, "t1", 2, kind="later")
        live = await reader.events(2)
        assert [(f.id, f.event) for f in live] == [(4, "later"), (5, "later")]


@pytest.mark.asyncio
async def test_last_event_id_resumes_with_exactly_the_rest() -> None:
    store = MemoryStore()
    await seed_thread(store, "t1", tenant="alpha", events=6)
    async with running_api(store) as api:
        alpha = api.client(ALPHA)
        async with alpha.stream("GET", "/v1/threads/t1/events", headers=STREAM) as response:
            seen = [f.id for f in await SSEReader(response).events(2)]
        assert seen == [1, 2]
        resume = {**STREAM, "Last-Event-ID": str(seen[-1])}
        async with alpha.stream(
            "GET", "/v1/threads/t1/events", params={"after": 0}, headers=resume
        ) as response:
            reader = SSEReader(response)
            rest = [f.id for f in await reader.events(4)]
            await add_events(store, "t1", 1)
            rest += [f.id for f in await reader.events(1)]
        assert seen + rest == [1, 2, 3, 4, 5, 6, 7], "no gap, no duplicate"
        async with alpha.stream(
            "GET", "/v1/threads/t1/events", params={"after": 5}, headers=STREAM
        ) as response:
            assert [f.id for f in await SSEReader(response).events(2)] == [6, 7]
        bad = await alpha.get("/v1/threads/t1/events", headers={**STREAM, "Last-Event-ID": "nope"})
        assert bad.status_code == 422 and bad.json()["field"] == "Last-Event-ID"


@pytest.mark.asyncio
async def test_an_idle_stream_sends_keep_alive_comments() -> None:
    store = MemoryStore()
    await seed_thread(store, "t1", tenant="alpha", events=1)
    async with (
        running_api(store, sse_keepalive=0.05) as api,
        api.client(ALPHA).stream(
            "GET", "/v1/threads/t1/events", params={"after": 1}, headers=STREAM
        ) as response,
    ):
        reader = SSEReader(response)
        frame = await reader.frame()
        assert frame.comment == "keep-alive" and frame.id is None
        await add_events(store, "t1", 1)
        assert [f.id for f in await reader.events(1)] == [2]


@pytest.mark.asyncio
async def test_streams_resume_across_a_server_restart_on_one_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with open_store(url) as store:
        await seed_thread(store, "t1", tenant="alpha", events=4)
        async with (
            running_api(store) as api,
            api.client(ALPHA).stream("GET", "/v1/threads/t1/events", headers=STREAM) as response,
        ):
            first = [f.id for f in await SSEReader(response).events(3)]
    assert first == [1, 2, 3]
    async with open_store(url) as store:  # a new server process, in effect
        await add_events(store, "t1", 2)
        async with running_api(store) as api:
            headers = {**STREAM, "Last-Event-ID": str(first[-1])}
            async with api.client(ALPHA).stream(
                "GET", "/v1/threads/t1/events", headers=headers
            ) as response:
                reader = SSEReader(response)
                rest = [f.id for f in await reader.events(3)]
                await add_events(store, "t1", 1)
                rest += [f.id for f in await reader.events(1)]
    assert first + rest == [1, 2, 3, 4, 5, 6, 7], "no gap, no duplicate across the restart"


@pytest.mark.asyncio
async def test_reading_below_the_compaction_floor_is_410_with_earliest_seq() -> None:
    store = MemoryStore()
    await seed_thread(store, "t1", tenant="alpha", events=6)
    assert await store.compact_events("t1", 4) == 4
    async with running_api(store) as api:
        alpha = api.client(ALPHA)
        for request in (
            alpha.get("/v1/threads/t1/events", params={"after": 1}),
            alpha.get("/v1/threads/t1/events", headers={**STREAM, "Last-Event-ID": "2"}),
        ):
            r = await request
            assert r.status_code == 410, r.text
            assert r.headers["content-type"] == "application/problem+json"
            problem = r.json()
            assert problem["type"] == "urn:wakeful:problem:replay-unavailable"
            assert problem["earliest_seq"] == 4 and problem["thread_id"] == "t1"
        page = (await alpha.get("/v1/threads/t1/events", params={"after": 3})).json()
        assert [e["seq"] for e in page["events"]] == [4, 5, 6]
        async with alpha.stream(
            "GET", "/v1/threads/t1/events", headers={**STREAM, "Last-Event-ID": "3"}
        ) as response:
            assert [f.id for f in await SSEReader(response).events(3)] == [4, 5, 6]


class CompactingStore(MemoryStore):
    """Compaction overtakes a slow reader between two reads of its stream."""

    overtaken = False

    async def wait_events(
        self, thread_id: str, after_seq: int = 0, limit: int = 100, timeout: float = 30.0
    ) -> list[Event]:
        if self.overtaken:
            raise ReplayUnavailable(thread_id, after_seq, after_seq + 5)
        return await super().wait_events(thread_id, after_seq, limit, timeout)


@pytest.mark.asyncio
async def test_a_stream_overtaken_by_compaction_ends_with_an_error_event() -> None:
    store = CompactingStore()
    await seed_thread(store, "t1", tenant="alpha", events=1)
    async with (
        running_api(store) as api,
        api.client(ALPHA).stream("GET", "/v1/threads/t1/events", headers=STREAM) as response,
    ):
        reader = SSEReader(response)
        assert [f.id for f in await reader.events(1)] == [1]
        store.overtaken = True
        await add_events(store, "t1", 1)
        [delivered, error] = await reader.events(2)
        assert delivered.id == 2
        assert error.event == "error" and error.id is None
        problem = json.loads(error.data)
        assert problem["status"] == 410 and problem["earliest_seq"] == 7
        assert await reader.ended()


@pytest.mark.asyncio
async def test_a_stream_ends_when_its_thread_passes_to_another_tenant() -> None:
    store = MemoryStore()
    await seed_thread(store, "t1", tenant="alpha", events=2)
    async with (
        running_api(store) as api,
        api.client(ALPHA).stream("GET", "/v1/threads/t1/events", headers=STREAM) as response,
    ):
        reader = SSEReader(response)
        assert [f.id for f in await reader.events(2)] == [1, 2]
        await store.delete_thread("t1")
        await seed_thread(store, "t1", tenant="beta", events=5)
        assert await reader.ended(), "nothing of beta's thread reaches alpha"


@pytest.mark.asyncio
async def test_open_streams_end_when_the_server_shuts_down() -> None:
    store = MemoryStore()
    await seed_thread(store, "t1", tenant="alpha", events=1)
    app = create_app(store, tokens=TOKENS, sse_keepalive=60.0)
    stop = asyncio.Event()

    async def serve_until_stopped(ready: asyncio.Future[str]) -> None:
        async with serving(app) as url:
            ready.set_result(url)
            await stop.wait()

    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve_until_stopped(ready))
    async with (
        httpx.AsyncClient(base_url=await ready, headers={"Authorization": f"Bearer {ALPHA}"}) as c,
        c.stream("GET", "/v1/threads/t1/events", headers=STREAM) as response,
    ):
        reader = SSEReader(response)
        assert [f.id for f in await reader.events(1)] == [1]
        stop.set()
        async with asyncio.timeout(5):  # far below the keep-alive and graceful timeouts
            assert await reader.ended()
    await server


@pytest.mark.asyncio
async def test_a_run_driven_through_the_api_by_a_worker() -> None:
    store = MemoryStore()
    wake = LocalWake()
    worker = Worker(
        store,
        registry(),
        concurrency=2,
        claims=ClaimPolicy(ttl=30, renew_every=10),
        wake=wake,
        worker_id="w1",
        poll_interval=0.05,
        retry_backoff=0.0,
    )
    working = asyncio.create_task(worker.run())
    try:
        async with running_api(store, registry=registry(), wake=wake) as api:
            alpha = api.client(ALPHA)
            async with alpha.stream("GET", "/v1/threads/job/events", headers=STREAM) as r:
                assert r.status_code == 404, "nothing there yet"
            submitted = await alpha.post(
                "/v1/threads/job/runs",
                json={"target": "approval"},
                headers={"Idempotency-Key": "j1"},
            )
            assert submitted.status_code == 202
            async with alpha.stream("GET", "/v1/threads/job/events", headers=STREAM) as response:
                reader = SSEReader(response)
                kinds: list[str | None] = []
                while "run.suspended" not in kinds:
                    kinds += [f.event for f in await reader.events(1)]
                thread = (await alpha.get("/v1/threads/job")).json()
                run_id = f"run-{keyed('alpha', 'j1')}"
                assert thread["status"] == "suspended" and thread["run_id"] == run_id
                [ticket] = thread["tickets"]
                assert ticket["question"] == "ship it?"
                resumed = await alpha.post(
                    "/v1/threads/job/resume", json={"answers": {ticket["id"]: "yes"}}
                )
                assert resumed.status_code == 202 and resumed.json()["run_id"] == run_id
                while "run.completed" not in kinds:
                    kinds += [f.event for f in await reader.events(1)]
            assert kinds[0] == "run.started" and "run.resumed" in kinds
            thread = (await alpha.get("/v1/threads/job")).json()
            assert thread["status"] == "completed" and thread["tenant"] == "alpha"
            assert thread["state"]["log"] == ["answer:yes"]
            runs = (await alpha.get("/v1/threads/job/runs")).json()["runs"]
            assert [(r["run_id"], r["status"]) for r in runs] == [(run_id, "completed")]

            resume_id = resumed.json()["dispatch_id"]

            async def settled() -> bool:
                d = await alpha.get(f"/v1/dispatches/{resume_id}")
                return bool(d.json()["status"] == "done")

            await eventually(settled)
    finally:
        await worker.stop(grace=5)
        await asyncio.wait_for(working, 10)
