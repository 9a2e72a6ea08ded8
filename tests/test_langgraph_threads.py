"""The LangGraph API's threads, assistants extras and crons, driven by the official
``langgraph-sdk`` (its async client and its sync client) against a real uvicorn server on
loopback over SQLite and PostgreSQL: thread records are durable (a restarted server keeps
the metadata of a thread that never ran), tenant-keyed (a token of another tenant sees
nothing of them), and crons are stored wakeful schedules."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.errors import AuthenticationError, ConflictError, NotFoundError

from tests.postgres_support import Databases
from tests.test_langgraph_api import TOKENS, serve
from wakeful import open_store
from wakeful.fleet.schedules import trigger_schedule
from wakeful.records import Checkpoint, Commit
from wakeful.server.langgraph_records import Exists, ThreadRecords, record_thread

pytest_plugins = ["tests.postgres_fixtures"]

ACME, GLOBEX = "token-acme-1234", "token-globex-99"
assert TOKENS[ACME] == "acme" and TOKENS[GLOBEX] == "globex"

Call = Callable[[Callable[[Any], Any]], Any]


class Clients:
    """SDK clients of one kind (``async`` or ``sync``) per token; ``call(token)(fn)`` runs
    ``fn(client)`` (a sync client in a worker thread: the server runs on this loop)."""

    def __init__(self, url: str, kind: str) -> None:
        self.url, self.kind = url, kind
        self.opened: dict[str, Any] = {}

    def _client(self, token: str) -> Any:
        if token not in self.opened:
            headers = {"Authorization": f"Bearer {token}"}
            make = get_client if self.kind == "async" else get_sync_client
            self.opened[token] = make(url=self.url, headers=headers)
        return self.opened[token]

    def __call__(self, token: str = ACME) -> Call:
        sdk = self._client(token)

        async def call(fn: Callable[[Any], Any]) -> Any:
            if self.kind == "async":
                return await fn(sdk)
            return await asyncio.to_thread(fn, sdk)

        return call

    async def close(self) -> None:
        for sdk in self.opened.values():
            if self.kind == "async":
                await sdk.aclose()
            else:
                sdk.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def new_store(request: Any, tmp_path: Path) -> Callable[[], Awaitable[str]]:
    """Makes the URL of a fresh store of the parameter's kind."""
    if request.param == "sqlite":

        async def sqlite() -> str:
            return f"sqlite:///{tmp_path / 'lg.db'}"

        return sqlite
    databases: Databases = request.getfixturevalue("pg_databases")
    return databases.clone


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_threads_with_the_sdk(new_store: Callable[[], Awaitable[str]], kind: str) -> None:
    async with serve(await new_store()) as (url, store):
        clients = Clients(url, kind)
        try:
            await _threads(clients(), clients(GLOBEX), store)
        finally:
            await clients.close()


async def _threads(acme: Call, globex: Call, store: Any) -> None:
    red = await acme(lambda c: c.threads.create(metadata={"team": "red", "n": 1}))
    tid = red["thread_id"]
    assert red["metadata"] == {"team": "red", "n": 1} and red["status"] == "idle"
    again = await acme(lambda c: c.threads.create(thread_id=tid, if_exists="do_nothing"))
    assert again["thread_id"] == tid and again["metadata"] == red["metadata"]
    with pytest.raises(ConflictError):
        await acme(lambda c: c.threads.create(thread_id=tid))
    with pytest.raises(ConflictError):  # another tenant's id is taken, not shown
        await globex(lambda c: c.threads.create(thread_id=tid, if_exists="do_nothing"))
    # the record is a stored wakeful thread of the tenant
    snap = await store.read(record_thread(tid))
    assert snap.tenant == "acme" and snap.checkpoint.state["metadata"]["team"] == "red"

    blue = await acme(lambda c: c.threads.create(metadata={"team": "blue"}))
    await acme(lambda c: c.runs.wait(blue["thread_id"], "steps", input={"log": []}))
    asked = await acme(lambda c: c.threads.create(metadata={"team": "blue"}))
    await acme(lambda c: c.runs.wait(asked["thread_id"], "approval", input={"log": []}))

    updated = await acme(lambda c: c.threads.update(tid, metadata={"n": 2, "x": "y"}))
    assert updated["metadata"] == {"team": "red", "n": 2, "x": "y"}
    assert (await acme(lambda c: c.threads.get(tid)))["metadata"] == updated["metadata"]
    snap = await store.read(record_thread(tid))
    assert snap.checkpoint.state["metadata"]["n"] == 2 and snap.checkpoint.parent is not None
    assert len(await store.checkpoints(record_thread(tid))) == 1  # the old one is dropped

    everything = await acme(lambda c: c.threads.search(limit=100))
    ids = [t["thread_id"] for t in everything]
    assert ids == [asked["thread_id"], blue["thread_id"], tid]  # newest first
    blues = await acme(lambda c: c.threads.search(metadata={"team": "blue"}))
    assert {t["thread_id"] for t in blues} == {blue["thread_id"], asked["thread_id"]}
    interrupted = await acme(lambda c: c.threads.search(status="interrupted"))
    assert [t["thread_id"] for t in interrupted] == [asked["thread_id"]]
    assert [t["thread_id"] for t in await acme(lambda c: c.threads.search(limit=1, offset=1))] == [
        blue["thread_id"]
    ]
    ran = next(t for t in everything if t["thread_id"] == blue["thread_id"])
    assert ran["values"] == {"log": ["one", "two"]}
    # a run shows its graph in the metadata, as LangGraph's server does (agent-chat-ui
    # searches by it), and the stored record keeps it
    assert ran["metadata"]["graph_id"] == "steps" and ran["metadata"]["team"] == "blue"
    by_graph = await acme(lambda c: c.threads.search(metadata={"graph_id": "steps"}))
    assert [t["thread_id"] for t in by_graph] == [blue["thread_id"]]
    assert (await store.read(record_thread(blue["thread_id"]))).checkpoint.state["graph"] == "steps"
    oldest = await acme(lambda c: c.threads.search(sort_by="created_at", sort_order="asc"))
    assert [t["thread_id"] for t in oldest] == ids[::-1]
    picked = await acme(lambda c: c.threads.search(ids=[tid, blue["thread_id"], "nope"]))
    assert {t["thread_id"] for t in picked} == {tid, blue["thread_id"]}
    assert await acme(lambda c: c.threads.count()) == 3
    assert await acme(lambda c: c.threads.count(metadata={"team": "blue"})) == 2
    assert await acme(lambda c: c.threads.count(status="interrupted")) == 1

    # tenants: globex sees none of acme's threads
    assert await globex(lambda c: c.threads.search()) == []
    assert await globex(lambda c: c.threads.count()) == 0
    for attempt in (
        lambda c: c.threads.get(tid),
        lambda c: c.threads.update(tid, metadata={"stolen": True}),
        lambda c: c.threads.copy(tid),
        lambda c: c.threads.delete(tid),
        lambda c: c.threads.get_state(blue["thread_id"]),
    ):
        with pytest.raises(NotFoundError):
            await globex(attempt)
    assert "stolen" not in (await acme(lambda c: c.threads.get(tid)))["metadata"]
    mine = await globex(lambda c: c.threads.create(metadata={"team": "red"}))
    assert [t["thread_id"] for t in await globex(lambda c: c.threads.search())] == [
        mine["thread_id"]
    ]
    reds = await acme(lambda c: c.threads.search(metadata={"team": "red"}))
    assert [t["thread_id"] for t in reds] == [tid]

    # copy: the same checkpoints and metadata on a new thread, then they diverge
    copied = await acme(lambda c: c.threads.copy(blue["thread_id"]))
    cid = copied["thread_id"]
    assert cid != blue["thread_id"] and copied["metadata"]["team"] == "blue"
    assert copied["metadata"]["graph_id"] == "steps"
    assert (await acme(lambda c: c.threads.get(cid)))["values"] == {"log": ["one", "two"]}
    source_history = await acme(lambda c: c.threads.get_history(blue["thread_id"]))
    copy_history = await acme(lambda c: c.threads.get_history(cid))
    assert [h["checkpoint"]["checkpoint_id"] for h in copy_history] == [
        h["checkpoint"]["checkpoint_id"] for h in source_history
    ]
    await acme(lambda c: c.runs.wait(cid, "steps", input={"log": ["more"]}))
    assert (await acme(lambda c: c.threads.get_state(cid)))["values"]["log"][-3:] == [
        "more",
        "one",
        "two",
    ]
    source = await acme(lambda c: c.threads.get_state(blue["thread_id"]))
    assert source["values"] == {"log": ["one", "two"]}

    # prune: keep_latest leaves the thread its latest checkpoint; delete removes it; another
    # tenant's thread is not counted (nor touched)
    kept = await acme(lambda c: c.threads.prune([cid], strategy="keep_latest"))
    assert kept == {"pruned_count": 1}
    assert len(await acme(lambda c: c.threads.get_history(cid))) == 1
    assert (await acme(lambda c: c.threads.get_state(cid)))["values"]["log"][-1] == "two"
    assert await globex(lambda c: c.threads.prune([cid, tid])) == {"pruned_count": 0}
    spare = await acme(lambda c: c.threads.create())
    assert await acme(lambda c: c.threads.prune([spare["thread_id"]])) == {"pruned_count": 1}
    assert await store.read(record_thread(spare["thread_id"])) is None

    # delete: the record and the checkpoints leave the store
    await acme(lambda c: c.threads.delete(blue["thread_id"]))
    with pytest.raises(NotFoundError):
        await acme(lambda c: c.threads.get(blue["thread_id"]))
    assert await store.read(record_thread(blue["thread_id"])) is None
    assert await acme(lambda c: c.threads.count()) == 3  # red, asked, the copy


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_assistants_extras_and_crons_with_the_sdk(
    new_store: Callable[[], Awaitable[str]], kind: str
) -> None:
    async with serve(await new_store()) as (url, store):
        clients = Clients(url, kind)
        try:
            await _assistants_and_crons(clients(), clients(GLOBEX), store)
        finally:
            await clients.close()


async def _assistants_and_crons(acme: Call, globex: Call, store: Any) -> None:
    assert await acme(lambda c: c.assistants.count()) == 3
    assert await acme(lambda c: c.assistants.count(graph_id="steps")) == 1
    drawn = await acme(lambda c: c.assistants.get_graph("steps"))
    assert {n["id"] for n in drawn["nodes"]} == {"__start__", "one", "two", "__end__"}
    schemas = await acme(lambda c: c.assistants.get_schemas("steps"))
    assert schemas["graph_id"] == "steps"
    assert "log" in schemas["input_schema"]["properties"]
    with pytest.raises(NotFoundError):
        await acme(lambda c: c.assistants.get_graph("nope"))

    thread = await acme(lambda c: c.threads.create())
    tid = thread["thread_id"]
    on_thread = await acme(
        lambda c: c.crons.create_for_thread(tid, "steps", schedule="*/5 * * * *", input={"log": []})
    )
    fresh = await acme(
        lambda c: c.crons.create("steps", schedule="0 9 * * *", input={"log": []}, enabled=False)
    )
    assert on_thread["thread_id"] == tid and on_thread["schedule"] == "*/5 * * * *"
    assert fresh["thread_id"] is None and fresh["enabled"] is False
    stored = await store.get_schedule(f"langgraph:cron:{on_thread['cron_id']}")
    assert (stored.target, stored.thread, stored.tenant, stored.cron, stored.paused) == (
        "steps",
        tid,
        "acme",
        "*/5 * * * *",
        False,
    )
    assert stored.input == {"log": []} and stored.next_fire_at is not None
    paused = await store.get_schedule(f"langgraph:cron:{fresh['cron_id']}")
    assert paused.paused and paused.thread_template == "{name}-{tick}"

    found = await acme(lambda c: c.crons.search())
    assert {c["cron_id"] for c in found} == {on_thread["cron_id"], fresh["cron_id"]}
    by_thread = await acme(lambda c: c.crons.search(thread_id=tid))
    assert [c["cron_id"] for c in by_thread] == [on_thread["cron_id"]]
    assert await acme(lambda c: c.crons.count()) == 2
    assert await globex(lambda c: c.crons.search()) == []
    with pytest.raises(NotFoundError):
        await globex(lambda c: c.crons.delete(on_thread["cron_id"]))
    with pytest.raises(NotFoundError):  # a cron on another tenant's thread
        await globex(lambda c: c.crons.create_for_thread(tid, "steps", schedule="* * * * *"))

    # firing is wakeful's: a trigger enqueues the graph's run on the thread, for the tenant
    name = f"langgraph:cron:{on_thread['cron_id']}"
    fired = await trigger_schedule(store, name)
    assert (fired.thread_id, fired.tenant) == (tid, "acme")
    assert fired.dispatch_id.startswith(f"sched:{name}:trigger:")
    assert fired.payload["target"] == "steps" and fired.payload["input"] == {"log": []}

    await acme(lambda c: c.crons.delete(on_thread["cron_id"]))
    assert await store.get_schedule(f"langgraph:cron:{on_thread['cron_id']}") is None
    assert [c["cron_id"] for c in await acme(lambda c: c.crons.search())] == [fresh["cron_id"]]


@pytest.mark.asyncio
async def test_crons_refuse_what_a_schedule_cannot_carry_and_api_keys_are_tokens(
    tmp_path: Path,
) -> None:
    async with serve(f"sqlite:///{tmp_path / 'c.db'}") as (url, store):
        headers = {"Authorization": f"Bearer {ACME}"}
        base = {"assistant_id": "steps", "schedule": "* * * * *"}
        async with httpx.AsyncClient(headers=headers) as raw:
            answers = {
                field: await raw.post(f"{url}/runs/crons", json={**base, field: value})
                for field, value in (
                    ("metadata", {"a": 1}),
                    ("end_time", "2030-01-01T00:00:00+00:00"),
                    ("multitask_strategy", "interrupt"),
                    ("config", {"configurable": {"k": 1}}),
                )
            }
            update = await raw.patch(f"{url}/runs/crons/x", json={"schedule": "* * * * *"})
            bad_cron = await raw.post(f"{url}/runs/crons", json={**base, "schedule": "often"})
            bad_zone = await raw.post(f"{url}/runs/crons", json={**base, "timezone": "Mars/Base"})
            no_graph = await raw.post(f"{url}/runs/crons", json={**base, "assistant_id": "nope"})
            info = await raw.get(f"{url}/info")
        keyed = get_client(url=url, api_key=GLOBEX)  # sent as X-Api-Key, as the SDKs do
        try:
            assert (await keyed.threads.create())["thread_id"]
            assert len(await keyed.threads.search()) == 1  # globex's, not acme's
        finally:
            await keyed.aclose()
        wrong = get_client(url=url, api_key="not-a-token-at-all")
        try:
            with pytest.raises(AuthenticationError):
                await wrong.threads.search()
        finally:
            await wrong.aclose()
        assert info.status_code == 200 and info.json()["flags"]["crons"] is True
        for field, answer in answers.items():
            assert answer.status_code == 501 and field in answer.json()["detail"], field
        assert update.status_code == 501
        assert bad_cron.status_code == 422 and bad_zone.status_code == 422
        assert no_graph.status_code == 404
        assert await store.list_schedules() == []


@pytest.mark.asyncio
async def test_a_restart_keeps_thread_records(new_store: Callable[[], Awaitable[str]]) -> None:
    store_url = await new_store()
    async with serve(store_url) as (url, _):
        clients = Clients(url, "async")
        try:
            made = await clients()(lambda c: c.threads.create(metadata={"owner": "ann"}))
            await clients()(lambda c: c.threads.update(made["thread_id"], metadata={"v": 2}))
        finally:
            await clients.close()
    async with serve(store_url) as (url, _):  # a new server: nothing in its memory
        clients = Clients(url, "sync")
        try:
            tid = made["thread_id"]
            got = await clients()(lambda c: c.threads.get(tid))
            assert got["metadata"] == {"owner": "ann", "v": 2} and got["status"] == "idle"
            assert got["created_at"] == made["created_at"]
            found = await clients()(lambda c: c.threads.search(metadata={"owner": "ann"}))
            assert [t["thread_id"] for t in found] == [tid]
            with pytest.raises(NotFoundError):
                await clients(GLOBEX)(lambda c: c.threads.get(tid))
            assert await clients(GLOBEX)(lambda c: c.threads.search()) == []
            waited = await clients()(lambda c: c.runs.wait(tid, "steps", input={"log": []}))
            assert waited == {"log": ["one", "two"]}
            ran = await clients()(lambda c: c.threads.search(metadata={"graph_id": "steps"}))
            assert [t["thread_id"] for t in ran] == [tid]
        finally:
            await clients.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("scheme", ["memory", "file"])
async def test_records_on_memory_and_file_stores(tmp_path: Path, scheme: str) -> None:
    """The records need nothing of a backend but the store contract: the same facts on the
    memory and file stores (SQLite and PostgreSQL: above, through the server)."""
    url = "memory://" if scheme == "memory" else f"file://{tmp_path / 'store'}"
    store = await open_store(url)
    try:
        records = ThreadRecords(store)
        ids = [str(uuid.uuid4()) for _ in range(3)]
        await records.create(ids[0], "acme", {"a": 1})
        await records.create(ids[1], "acme", {"a": 2}, graph="steps")
        await records.create(ids[2], "globex", {"a": 1})
        with pytest.raises(Exists):
            await records.create(ids[0], "acme", {})
        with pytest.raises(Exists):  # another tenant's id
            await records.create(ids[0], "globex", {})
        updated = await records.update(ids[0], metadata={"b": True})
        assert updated is not None and updated.metadata == {"a": 1, "b": True}
        assert len(await store.checkpoints(record_thread(ids[0]))) == 1
        acme = [e.thread_id async for e in records.scan("acme", every_tenant=False)]
        assert acme == sorted(ids[:2])
        every = [e.thread_id async for e in records.scan(None, every_tenant=True)]
        assert every == sorted(ids)
        await records.delete(ids[1])
        assert await records.get(ids[1]) is None
        assert await records.update(ids[1], metadata={}) is None
        got = await records.get(ids[0])
        assert got is not None and (got.tenant, got.metadata) == ("acme", {"a": 1, "b": True})
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_search_skips_lookalike_thread_ids(tmp_path: Path) -> None:
    """Wakeful threads whose ids look like records' (one under the prefix, ones a linguistic
    collation may sort among them) are skipped, and the records after them still found."""
    store = await open_store("memory://")
    try:
        records = ThreadRecords(store)
        late = "f" * 8 + "-0000-4000-8000-" + "0" * 12
        await records.create("00000000-0000-4000-8000-000000000000", "acme", {})
        for lookalike in ("langgraph:threadX", "langgraph:thread:not-a-record", "langgraph"):
            checkpoint = Checkpoint(
                id="c1",
                parent=None,
                run_id="r",
                status="completed",
                state={"x": 1},
                created_at=datetime.now(UTC),
                tenant="acme",
            )
            await store.claim_and_commit(
                lookalike, "t", 30, Commit(token=0, checkpoint=checkpoint, release=True)
            )
        await records.create(late, "acme", {})
        found = [e.thread_id async for e in records.scan("acme", every_tenant=False)]
        assert found[-1] == late and len(found) == 2
    finally:
        await store.close()
