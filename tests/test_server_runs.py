"""Submitting work over HTTP: start (idempotent by key), resume, cancel, messages, and the
runs of a thread. Bodies are bounded, ids validated, unknown fields refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypedDict

import pytest
import pytest_asyncio

from tests.server_support import (
    ALPHA,
    BETA,
    OPERATOR,
    Api,
    keyed,
    registry,
    running_api,
    seed_thread,
)
from wakeful.agent import Agent
from wakeful.fleet.client import submit as client_submit
from wakeful.providers.scripted import Scripted
from wakeful.runtime import START, Graph
from wakeful.store.memory import MemoryStore


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    store = MemoryStore()
    async with running_api(store, max_body_bytes=4096) as running:
        yield running


@pytest.mark.asyncio
async def test_submit_answers_202_with_the_ids_and_persists_a_dispatch(api: Api) -> None:
    alpha = api.client(ALPHA)
    r = await alpha.post(
        "/v1/threads/t1/runs",
        json={"target": "echo", "input": {"q": 1}, "priority": 3, "max_attempts": 2},
        headers={"Idempotency-Key": "key-1"},
    )
    assert r.status_code == 202, r.text
    key = keyed("alpha", "key-1")
    assert r.json() == {
        "dispatch_id": key,
        "run_id": f"run-{key}",
        "thread_id": "t1",
        "kind": "start",
        "status": "pending",
        "message_id": None,
        "not_before": None,
        "queued_behind": None,
    }
    assert r.headers["location"] == f"/v1/dispatches/{key}"
    d = await api.store.get_dispatch(key)
    assert d is not None and (d.priority, d.max_attempts) == (3, 2)
    assert d.payload == {
        "target": "echo",
        "input": {"q": 1},
        "run_id": f"run-{key}",
        "tenant": "alpha",
    }
    without_key = await alpha.post("/v1/threads/t2/runs", json={"target": "echo"})
    assert without_key.status_code == 202
    assert without_key.json()["run_id"] == f"run-{without_key.json()['dispatch_id']}"


@pytest.mark.asyncio
async def test_submit_is_idempotent_by_key_and_a_different_body_is_409(api: Api) -> None:
    alpha = api.client(ALPHA)
    body = {"target": "echo", "input": {"q": 1}}
    key = {"Idempotency-Key": "k-1"}
    first = await alpha.post("/v1/threads/t1/runs", json=body, headers=key)
    again = await alpha.post("/v1/threads/t1/runs", json=body, headers=key)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert len(await api.store.list_dispatches(thread_id="t1")) == 1
    for other in (
        {"target": "echo", "input": {"q": 2}},
        {"target": "other", "input": {"q": 1}},
        {**body, "priority": 5},
        {**body, "max_attempts": 1},
    ):
        r = await alpha.post("/v1/threads/t1/runs", json=other, headers=key)
        assert r.status_code == 409, other
        assert r.headers["content-type"] == "application/problem+json"
        problem = r.json()
        assert problem["type"] == "urn:wakeful:problem:dispatch-conflict"
        assert problem["dispatch_id"] == keyed("alpha", "k-1") and problem["status"] == 409
    elsewhere = await alpha.post("/v1/threads/t9/runs", json=body, headers=key)
    assert elsewhere.status_code == 409, "a key names one dispatch, on one thread"
    assert len(await api.store.list_dispatches()) == 1


@pytest.mark.asyncio
async def test_bad_ids_unknown_fields_and_bad_values_are_422_naming_the_field(api: Api) -> None:
    alpha = api.client(ALPHA)
    cases = [
        ("/v1/threads/-bad/runs", {"target": "echo"}, {}, "thread_id"),
        ("/v1/threads/" + "x" * 201 + "/runs", {"target": "echo"}, {}, "thread_id"),
        ("/v1/threads/t1/runs", {"target": "no spaces"}, {}, "target"),
        ("/v1/threads/t1/runs", {"target": "echo", "extra": 1}, {}, "extra"),
        ("/v1/threads/t1/runs", {"input": 1}, {}, "target"),
        ("/v1/threads/t1/runs", {"target": "echo", "priority": 10**6}, {}, "priority"),
        ("/v1/threads/t1/runs", {"target": "echo", "max_attempts": 0}, {}, "max_attempts"),
        ("/v1/threads/t1/runs", {"target": "echo"}, {"Idempotency-Key": "a/b"}, "Idempotency-Key"),
        ("/v1/threads/t1/messages", {"payload": 1, "message_id": "x" * 191}, {}, "message_id"),
        ("/v1/threads/t1/resume", {"answers": {"bad key": 1}}, {}, "answers.bad key.[key]"),
    ]
    for path, body, headers, field in cases:
        r = await alpha.post(path, json=body, headers=headers)
        assert r.status_code == 422, (path, body, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        problem = r.json()
        assert problem["field"] == field, problem
        assert problem["type"] == "urn:wakeful:problem:invalid-input"
    broken = await alpha.post(
        "/v1/threads/t1/runs", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert broken.status_code == 422 and broken.json()["field"] == "body"
    assert await api.store.list_dispatches() == []


@pytest.mark.asyncio
async def test_a_body_over_the_limit_is_413(api: Api) -> None:
    alpha = api.client(ALPHA)
    big = {"target": "echo", "input": "x" * 5000}
    r = await alpha.post("/v1/threads/t1/runs", json=big)
    assert r.status_code == 413
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["limit"] == 4096

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        yield b'{"target": "echo", "input": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    streamed = await alpha.post(
        "/v1/threads/t1/runs", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert streamed.status_code == 413
    assert await api.store.list_dispatches() == []


@pytest.mark.asyncio
async def test_an_unknown_target_is_422_when_a_registry_is_given() -> None:
    async with running_api(MemoryStore(), registry=registry()) as api:
        alpha = api.client(ALPHA)
        r = await alpha.post("/v1/threads/t1/runs", json={"target": "nope"})
        assert r.status_code == 422
        assert r.json()["field"] == "target" and "approval, echo" in r.json()["detail"]
        message = await alpha.post("/v1/threads/t1/messages", json={"payload": 1, "target": "x"})
        assert message.status_code == 422
        ok = await alpha.post("/v1/threads/t1/runs", json={"target": "echo"})
        assert ok.status_code == 202


@pytest.mark.asyncio
async def test_resume_answers_open_tickets_of_a_suspended_run(api: Api) -> None:
    await seed_thread(api.store, "t1", tenant="alpha", status="suspended", tickets=("t-a", "t-b"))
    alpha = api.client(ALPHA)
    unknown = await alpha.post("/v1/threads/t1/resume", json={"answers": {"nope": 1}})
    assert unknown.status_code == 409 and unknown.json()["tickets"] == ["nope"]
    key = {"Idempotency-Key": "resume-1"}
    r = await alpha.post("/v1/threads/t1/resume", json={"answers": {"t-a": "yes"}}, headers=key)
    assert r.status_code == 202, r.text
    assert r.json()["kind"] == "resume" and r.json()["run_id"] == "run-1"
    assert r.json()["dispatch_id"] == keyed("alpha", "resume-1")
    d = await api.store.get_dispatch(keyed("alpha", "resume-1"))
    assert d is not None and d.payload == {"answers": {"t-a": "yes"}, "tenant": "alpha"}
    # The run moved on: a replay of the same request still answers the same dispatch.
    await seed_thread(api.store, "t1", tenant="alpha", status="running")
    again = await alpha.post("/v1/threads/t1/resume", json={"answers": {"t-a": "yes"}}, headers=key)
    assert again.status_code == 202 and again.json() == r.json()
    other = await alpha.post("/v1/threads/t1/resume", json={"answers": {"t-a": "no"}}, headers=key)
    assert other.status_code == 409
    fresh = await alpha.post("/v1/threads/t1/resume", json={"answers": {"t-a": "yes"}})
    assert fresh.status_code == 409
    assert fresh.json()["type"] == "urn:wakeful:problem:not-suspended"
    missing = await alpha.post("/v1/threads/nope/resume", json={"answers": {}})
    assert missing.status_code == 404


@pytest.mark.asyncio
async def test_cancel_persists_one_cancel_dispatch(api: Api) -> None:
    await seed_thread(api.store, "t1", tenant="alpha", status="running")
    alpha = api.client(ALPHA)
    r = await alpha.post("/v1/threads/t1/cancel", json={"reason": "user asked"})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["kind"] == "cancel" and body["run_id"] == "run-1"
    no_body = await alpha.post("/v1/threads/t1/cancel")
    assert no_body.status_code == 202
    assert no_body.json()["dispatch_id"] == body["dispatch_id"], "a pending cancel is reused"
    d = await api.store.get_dispatch(body["dispatch_id"])
    assert d is not None and d.payload == {"reason": "user asked"}
    assert (await alpha.post("/v1/threads/nope/cancel")).status_code == 404


@pytest.mark.asyncio
async def test_messages_are_deduplicated_by_message_id_and_carry_the_tenant(api: Api) -> None:
    await seed_thread(api.store, "t1", tenant="alpha")
    alpha = api.client(ALPHA)
    body = {"payload": {"text": "hi"}, "message_id": "msg-1"}
    first = await alpha.post("/v1/threads/t1/messages", json=body)
    again = await alpha.post("/v1/threads/t1/messages", json=body)
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json()
    assert first.json()["message_id"] == "msg-1" and first.json()["kind"] == "message"
    d = await api.store.get_dispatch(first.json()["dispatch_id"])
    assert d is not None and d.payload["tenant"] == "alpha" and d.payload["external"] is True
    changed = await alpha.post("/v1/threads/t1/messages", json={**body, "payload": "other"})
    assert changed.status_code == 409
    keyed = await alpha.post(
        "/v1/threads/t1/messages", json={"payload": 1}, headers={"Idempotency-Key": "mk"}
    )
    assert keyed.json()["message_id"] == "mk"
    # Development mode (no tenant): exactly the dispatch fleet.client.send_message makes.
    async with running_api(MemoryStore(), tokens=None) as dev:
        r = await dev.client(None).post("/v1/threads/t1/messages", json=body)
        d = await dev.store.get_dispatch(r.json()["dispatch_id"])
        assert d is not None and d.payload["tenant"] is None


@pytest.mark.asyncio
async def test_runs_are_grouped_from_checkpoint_history_newest_first(api: Api) -> None:
    store = api.store
    await seed_thread(store, "t1", tenant="alpha", run_id="run-a", status="running")
    await seed_thread(store, "t1", tenant="alpha", run_id="run-a", status="completed")
    await seed_thread(store, "t1", tenant="alpha", run_id="run-b", status="running")
    await seed_thread(store, "t1", tenant="alpha", run_id="run-b", status="suspended")
    await seed_thread(store, "t1", tenant="alpha", run_id="run-c", status="failed")
    alpha = api.client(ALPHA)
    queued = await alpha.post(
        "/v1/threads/t1/runs", json={"target": "echo"}, headers={"Idempotency-Key": "next"}
    )
    assert queued.status_code == 202
    r = await alpha.get("/v1/threads/t1/runs")
    assert r.status_code == 200
    runs = r.json()["runs"]
    queued_run = f"run-{keyed('alpha', 'next')}"
    assert [(x["run_id"], x["status"], x["checkpoints"]) for x in runs] == [
        (queued_run, "queued", 0),
        ("run-c", "failed", 1),
        ("run-b", "suspended", 2),
        ("run-a", "completed", 2),
    ]
    assert runs[1]["graph"] == "g" and runs[2]["checkpoint_id"] == "run-b-c4"
    first = await alpha.get("/v1/threads/t1/runs", params={"limit": 2})
    page = first.json()
    assert [x["run_id"] for x in page["runs"]] == [queued_run, "run-c", "run-b"]
    assert page["next_before"] == "run-b-c3"
    rest = await alpha.get("/v1/threads/t1/runs", params={"before": page["next_before"]})
    assert [x["run_id"] for x in rest.json()["runs"]] == ["run-a"]
    assert rest.json()["next_before"] is None


@pytest.mark.asyncio
async def test_operators_act_for_the_threads_tenant(api: Api) -> None:
    await seed_thread(api.store, "t1", tenant="alpha", status="suspended", tickets=("q",))
    operator = api.client(OPERATOR)
    r = await operator.post("/v1/threads/t1/resume", json={"answers": {"q": 1}})
    assert r.status_code == 202
    d = await api.store.get_dispatch(r.json()["dispatch_id"])
    assert d is not None and d.payload["tenant"] == "alpha"
    beta = api.client(BETA)
    assert (await beta.post("/v1/threads/t1/resume", json={"answers": {"q": 1}})).status_code == 404


@pytest.mark.asyncio
async def test_idempotency_keys_and_message_ids_are_each_tenants_own(api: Api) -> None:
    """Tenant beta can neither probe alpha's keys (409 against 202) nor take them first;
    operators' keys (and development mode's) stay the dispatch id; a dispatch a tenant
    stored under its bare key before keys were scoped is still what its retry replays."""
    alpha, beta, operator = api.client(ALPHA), api.client(BETA), api.client(OPERATOR)
    await seed_thread(api.store, "tb", tenant="beta")
    squat = {"Idempotency-Key": "sms-1000"}
    taken = await beta.post("/v1/threads/tb/runs", json={"target": "echo"}, headers=squat)
    assert taken.status_code == 202, taken.text
    body = {"target": "echo", "input": {"q": 1}}
    mine = await alpha.post("/v1/threads/ta/runs", json=body, headers=squat)
    assert mine.status_code == 202, mine.text
    assert mine.json()["dispatch_id"] == keyed("alpha", "sms-1000") != taken.json()["dispatch_id"]
    again = await alpha.post("/v1/threads/ta/runs", json=body, headers=squat)
    assert again.status_code == 202 and again.json() == mine.json()
    probe = await beta.post("/v1/threads/tb/runs", json={"target": "other"}, headers=squat)
    assert probe.status_code == 409, "beta's own key, another body"
    assert probe.json()["dispatch_id"] == taken.json()["dispatch_id"]
    for thread, client in (("tb", beta), ("ta", alpha), ("ta", alpha)):
        sent = await client.post(
            f"/v1/threads/{thread}/messages", json={"payload": {"n": 1}, "message_id": "m-7"}
        )
        assert sent.status_code == 202 and sent.json()["message_id"] == "m-7", sent.text
    messages = [d for d in await api.store.list_dispatches() if d.kind == "message"]
    assert sorted((d.thread_id, d.dispatch_id, d.payload["message_id"]) for d in messages) == [
        ("ta", f"ext-{keyed('alpha', 'm-7')}", "m-7"),
        ("tb", f"ext-{keyed('beta', 'm-7')}", "m-7"),
    ]
    plain = await operator.post(
        "/v1/threads/to/runs", json={"target": "echo"}, headers={"Idempotency-Key": "op-1"}
    )
    assert plain.status_code == 202 and plain.json()["dispatch_id"] == "op-1"
    await client_submit(api.store, "ta", "echo", None, dispatch_id="old-1", tenant="alpha")
    retried = await alpha.post(
        "/v1/threads/ta/runs", json={"target": "echo"}, headers={"Idempotency-Key": "old-1"}
    )
    assert retried.status_code == 202 and retried.json()["dispatch_id"] == "old-1"
    assert len(await api.store.list_dispatches(thread_id="ta")) == 3  # sms-1000, m-7, old-1
    long = "k" * 178  # with the 13-character tag, past the 190 a key may have
    cases: list[tuple[str, dict[str, Any], dict[str, str], str]] = [
        ("runs", {"target": "echo"}, {"Idempotency-Key": long}, "Idempotency-Key"),
        ("messages", {"payload": 1, "message_id": long}, {}, "message_id"),
    ]
    for path, body, headers, field in cases:
        refused = await alpha.post(f"/v1/threads/ta/{path}", json=body, headers=headers)
        assert refused.status_code == 422 and refused.json()["field"] == field, refused.text
    assert len(await api.store.list_dispatches(thread_id="ta")) == 3


@pytest.mark.asyncio
async def test_targets_say_what_each_takes() -> None:
    """The console's submit form reads it: an agent takes text, a graph a JSON object of its
    state fields (typed where an input replaces the field)."""

    class Order(TypedDict):
        items: list[int]
        note: str

    order = Graph(Order, name="order").node("n", lambda s: {}).edge(START, "n").compile()
    helper = Agent("helper", Scripted.of(), "Help.")
    targets = registry().add("helper", helper).add("order", order)
    async with running_api(MemoryStore(), registry=targets) as api:
        listed = (await api.client(ALPHA).get("/v1/targets")).json()
    assert listed["registry"] is True
    by_name = {t["name"]: t for t in listed["targets"]}
    assert sorted(by_name) == ["approval", "echo", "helper", "order"]
    assert by_name["helper"]["kind"] == "agent"
    assert by_name["helper"]["input_schema"]["type"] == "string"
    assert by_name["order"]["kind"] == "graph"
    assert by_name["order"]["input_schema"]["properties"] == {
        "items": {"type": "array", "items": {"type": "integer"}},
        "note": {"type": "string"},
    }
    assert by_name["echo"]["input_schema"]["properties"] == {"log": {}}  # append: any item
    assert [t["name"] for t in listed["targets"] if t["default"]] == ["echo"]
    async with running_api(MemoryStore()) as bare:
        assert (await bare.client(ALPHA).get("/v1/targets")).json() == {
            "targets": [],
            "registry": False,
        }
