"""Reading threads over HTTP, and tenant isolation: a tenant never sees or touches another
tenant's thread (404, exactly like a missing one), and lists only its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.metrics_support import sample
from tests.server_support import (
    ALPHA,
    BETA,
    OPERATOR,
    STREAM,
    Api,
    add_events,
    running_api,
    seed_thread,
)
from wakeful.errors import (
    InvalidInput,
    OperationConflict,
    StaleClaim,
    StoreUnavailable,
    TenantMismatch,
    ThreadBusy,
    VersionConflict,
)
from wakeful.records import ThreadSnapshot
from wakeful.store.memory import MemoryStore


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api(MemoryStore()) as running:
        yield running


@pytest.mark.asyncio
async def test_a_thread_shows_status_run_claim_state_counts_and_tickets(api: Api) -> None:
    await seed_thread(
        api.store,
        "t1",
        tenant="alpha",
        status="suspended",
        events=3,
        messages=2,
        tickets=("ask-1",),
        state={"log": ["a"]},
    )
    claim = await api.store.claim("t1", "worker-7", 60)
    r = await api.client(ALPHA).get("/v1/threads/t1")
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["thread_id"] == "t1" and view["tenant"] == "alpha"
    assert (view["version"], view["status"], view["run_id"]) == (1, "suspended", "run-1")
    assert view["checkpoint_id"] == "run-1-c1" and view["graph"] == "g"
    assert view["state"] == {"log": ["a"]}
    assert (view["message_count"], view["last_seq"], view["event_floor"]) == (2, 3, 1)
    assert view["claim"]["holder"] == "worker-7" and view["claim"]["token"] == claim.token
    assert view["claim"]["expires_at"]
    assert [t["id"] for t in view["tickets"]] == ["ask-1"]
    assert view["tickets"][0]["question"] == "q ask-1?"


@pytest.mark.asyncio
async def test_a_submitted_thread_is_visible_to_its_tenant_before_any_run(api: Api) -> None:
    alpha, beta = api.client(ALPHA), api.client(BETA)
    assert (await alpha.get("/v1/threads/new")).status_code == 404
    await alpha.post("/v1/threads/new/runs", json={"target": "echo"})
    r = await alpha.get("/v1/threads/new")
    assert r.status_code == 200
    assert r.json()["version"] == 0 and r.json()["status"] is None
    assert r.json()["tenant"] == "alpha"
    assert (await beta.get("/v1/threads/new")).status_code == 404
    taken = await beta.post("/v1/threads/new/runs", json={"target": "echo"})
    assert taken.status_code == 404, "queued work already claims the thread for alpha"


@pytest.mark.asyncio
async def test_messages_page_by_count(api: Api) -> None:
    await seed_thread(api.store, "t1", tenant="alpha", messages=5)
    alpha = api.client(ALPHA)
    first = (await alpha.get("/v1/threads/t1/messages", params={"limit": 3})).json()
    assert [m["content"] for m in first["messages"]] == ["hello 0", "hello 1", "hello 2"]
    assert first["messages"][0]["role"] == "user" and first["next_after"] == 3
    rest = (await alpha.get("/v1/threads/t1/messages", params={"after": 3})).json()
    assert [m["id"] for m in rest["messages"]] == ["m3", "m4"] and rest["next_after"] == 5
    bad = await alpha.get("/v1/threads/t1/messages", params={"limit": 0})
    assert bad.status_code == 422 and bad.json()["field"] == "limit"


@pytest.mark.asyncio
async def test_the_list_shows_only_the_callers_threads_by_cursor(api: Api) -> None:
    for i in range(5):
        await seed_thread(api.store, f"a{i}", tenant="alpha")
    await seed_thread(api.store, "b0", tenant="beta")
    await seed_thread(api.store, "n0")
    alpha = api.client(ALPHA)
    page = (await alpha.get("/v1/threads", params={"limit": 2})).json()
    assert [t["thread_id"] for t in page["threads"]] == ["a0", "a1"]
    seen = [t["thread_id"] for t in page["threads"]]
    while page["next_after"] is not None:
        page = (
            await alpha.get("/v1/threads", params={"limit": 2, "after": page["next_after"]})
        ).json()
        seen += [t["thread_id"] for t in page["threads"]]
    assert seen == ["a0", "a1", "a2", "a3", "a4"]
    assert all(t["tenant"] == "alpha" for t in page["threads"])
    beta = (await api.client(BETA).get("/v1/threads")).json()
    assert [t["thread_id"] for t in beta["threads"]] == ["b0"]
    peek = await alpha.get("/v1/threads", params={"tenant": "beta"})
    assert peek.status_code == 403
    operator = api.client(OPERATOR)
    everyone = (await operator.get("/v1/threads")).json()
    assert len(everyone["threads"]) == 7
    only_beta = (await operator.get("/v1/threads", params={"tenant": "beta"})).json()
    assert [t["thread_id"] for t in only_beta["threads"]] == ["b0"]


@pytest.mark.asyncio
async def test_another_tenants_thread_is_404_for_every_read_and_write(api: Api) -> None:
    await seed_thread(api.store, "secret", tenant="beta", status="suspended", tickets=("q",))
    await add_events(api.store, "secret", 2)
    alpha = api.client(ALPHA)
    missing = await alpha.get("/v1/threads/does-not-exist")
    attempts = [
        alpha.get("/v1/threads/secret"),
        alpha.get("/v1/threads/secret/messages"),
        alpha.get("/v1/threads/secret/runs"),
        alpha.get("/v1/threads/secret/events"),
        alpha.get("/v1/threads/secret/events", headers=STREAM),
        alpha.get("/v1/dispatches", params={"thread_id": "secret"}),
        alpha.post("/v1/threads/secret/runs", json={"target": "echo"}),
        alpha.post("/v1/threads/secret/resume", json={"answers": {"q": 1}}),
        alpha.post("/v1/threads/secret/cancel", json={"reason": "mine now"}),
        alpha.post("/v1/threads/secret/messages", json={"payload": "hi"}),
    ]
    for attempt in attempts:
        r = await attempt
        assert r.status_code == 404, r.text
        body = r.json()
        assert body["type"] == missing.json()["type"] == "urn:wakeful:problem:not-found"
        assert "beta" not in r.text and "tenant" not in body["detail"]
        assert body["detail"] == "thread 'secret' does not exist"
    assert await api.store.list_dispatches() == [], "nothing was submitted"
    snap = await api.store.read("secret")
    assert snap is not None and snap.version == 2 and snap.claim is None, "nothing changed"
    beta = api.client(BETA)
    assert (await beta.get("/v1/threads/secret")).status_code == 200
    assert (await api.client(OPERATOR).get("/v1/threads/secret")).status_code == 200


class FaultyStore(MemoryStore):
    """Reads of thread ``boom`` raise ``fault``."""

    fault: BaseException | None = None

    async def read(self, thread_id: str) -> ThreadSnapshot | None:
        if thread_id == "boom" and self.fault is not None:
            raise self.fault
        return await super().read(thread_id)


@pytest.mark.asyncio
async def test_errors_become_problem_documents_in_one_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FaultyStore()
    async with running_api(store) as api:
        alpha = api.client(ALPHA)
        cases: list[tuple[BaseException, int, str]] = [
            (ThreadBusy("boom", "w1", None), 409, "thread-busy"),
            (StaleClaim("boom", 3, 4), 409, "stale-claim"),
            (VersionConflict("boom", 1, 2), 409, "version-conflict"),
            (OperationConflict("boom", "op"), 409, "operation-conflict"),
            (TenantMismatch("boom"), 404, "not-found"),
            (InvalidInput("thread_id", "nope"), 422, "invalid-input"),
            (StoreUnavailable("db down"), 503, "store-unavailable"),
            (RuntimeError("secret internals"), 500, "internal"),
        ]
        for fault, status, slug in cases:
            store.fault = fault
            r = await alpha.get("/v1/threads/boom")
            assert r.status_code == status, (fault, r.text)
            assert r.headers["content-type"] == "application/problem+json"
            body = r.json()
            assert body["type"] == f"urn:wakeful:problem:{slug}" and body["status"] == status
            assert body["title"] and body["detail"] and body["instance"] == "/v1/threads/boom"
        assert "secret internals" not in r.text and body["error_id"] in r.text
        assert any(body["error_id"] in record.getMessage() for record in caplog.records)
        scrape = (await api.client(None).get("/metrics")).text
    assert sample(scrape, "wakeful_stale_claims_total") == 1
