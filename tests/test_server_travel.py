"""Time travel over HTTP (issue 37): the history with its branches, one checkpoint with the
messages as of it, replay (``from_checkpoint``), edit state, fork, edit and regenerate. Each
route acts for the thread's own tenant only: another tenant's thread answers exactly like a
missing one. Against a real server on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio

import wakeful
from tests.server_support import ALPHA, BETA, OPERATOR, Api, running_api
from wakeful.agent import Agent
from wakeful.errors import GraphChanged
from wakeful.fleet.registry import Registry
from wakeful.providers.scripted import Scripted
from wakeful.runtime import END, START, Graph, Runtime, append
from wakeful.runtime.graph import CompiledGraph
from wakeful.server.problems import problem_for
from wakeful.store.memory import MemoryStore


class Routed(TypedDict):
    trail: Annotated[list[str], append]
    x: int


def router_graph() -> CompiledGraph:
    def step(name: str) -> Any:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            return {"trail": [name]}

        return node

    return (
        Graph(Routed, name="router")
        .node("decide", step("decide"))
        .node("pos", step("pos"))
        .node("neg", step("neg"))
        .edge(START, "decide")
        .conditional_edge("decide", lambda s: "pos" if s["x"] > 0 else "neg")
        .edge("pos", END)
        .edge("neg", END)
        .compile()
    )


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    store = MemoryStore()
    helper = Agent("helper", Scripted.replies("one", "two"))
    registry = Registry(default="router").add("router", router_graph()).add("helper", helper)
    runtime = Runtime(store)
    run = await runtime.start("t1", router_graph(), {"trail": [], "x": -1}, tenant="alpha")
    await run.result()
    for text in ("first", "second"):
        assert (await helper.run(runtime, "chat", text, tenant="alpha")).status == "completed"
    async with running_api(store, registry=registry) as running:
        yield running


def _missing_like(a: Any, b: Any) -> None:
    """Two 404 answers that say the same, except for the path they name."""
    assert a.status_code == b.status_code == 404, (a.text, b.text)
    left = {k: v for k, v in a.json().items() if k != "instance"}
    right = {k: v for k, v in b.json().items() if k != "instance"}
    left["detail"] = left["detail"].replace("t1", "X").replace("chat", "X")
    right["detail"] = right["detail"].replace("nope", "X")
    assert left == right


@pytest.mark.asyncio
async def test_the_history_pages_newest_first_with_branches_and_one_checkpoint_in_full(
    api: Api,
) -> None:
    alpha = api.client(ALPHA)
    r = await alpha.get("/v1/threads/t1/history")
    assert r.status_code == 200, r.text
    page = r.json()
    assert [e["nodes"] for e in page["entries"]] == [["neg"], ["decide"], []]
    assert [e["head"] for e in page["entries"]] == [True, False, False]
    assert page["branches"] == [] and page["next_before"] is None
    after_decide = page["entries"][1]["checkpoint_id"]

    # edit the state on an earlier checkpoint: the thread branches there
    r = await alpha.post(
        "/v1/threads/t1/state",
        json={"values": {"x": 5}, "as_node": "decide", "checkpoint_id": after_decide},
    )
    assert r.status_code == 200, r.text
    edited = r.json()
    assert edited["entry"]["source"] == "update" and edited["entry"]["branch"] == 1
    assert [t["node"] for t in edited["frontier"]] == ["pos"]
    assert edited["state"] == {"trail": ["decide"], "x": 5}

    first = (await alpha.get("/v1/threads/t1/history", params={"limit": 2})).json()
    assert first["entries"][0]["checkpoint_id"] == edited["entry"]["checkpoint_id"]
    rest = (
        await alpha.get("/v1/threads/t1/history", params={"before": first["next_before"]})
    ).json()
    entries = first["entries"] + rest["entries"]
    assert [(e["nodes"], e["branch"], e["current"]) for e in entries] == [
        (["decide"], 1, True),
        (["neg"], 0, False),
        (["decide"], 0, True),
        ([], 0, True),
    ]
    (branch,) = first["branches"]
    assert branch["fork_point"] == after_decide
    assert branch["old_head"] == entries[1]["checkpoint_id"]

    r = await alpha.get(f"/v1/threads/t1/checkpoints/{entries[1]['checkpoint_id']}")
    assert r.status_code == 200, r.text
    old = r.json()
    assert old["state"]["trail"] == ["decide", "neg"] and old["entry"]["current"] is False
    assert old["messages"] == [] and old["next_after"] is None

    # messages as of a checkpoint, paged
    chat = (await alpha.get("/v1/threads/chat/history")).json()["entries"]
    after_one = next(e for e in chat if e["messages"] == 2)["checkpoint_id"]
    r = await alpha.get(f"/v1/threads/chat/checkpoints/{after_one}", params={"limit": 1})
    assert [m["content"] for m in r.json()["messages"]] == ["first"]
    assert r.json()["next_after"] == 1
    r = await alpha.get(f"/v1/threads/chat/checkpoints/{after_one}", params={"after": 1})
    assert [m["content"] for m in r.json()["messages"]] == ["one"]
    assert r.json()["next_after"] is None

    r = await alpha.get("/v1/threads/t1/checkpoints/cp-none")
    assert r.status_code == 404 and "cp-none" in r.json()["detail"]


@pytest.mark.asyncio
async def test_another_tenants_thread_is_missing_for_every_time_travel_route(api: Api) -> None:
    beta = api.client(BETA)
    head = (await api.store.read("t1")).checkpoint.id  # type: ignore[union-attr]
    before = await api.store.read("t1")
    chat_before = await api.store.read("chat")
    last_user = (await api.store.messages("chat", 2, 1))[0].id
    calls = [
        ("GET", "/v1/threads/{}/history", None),
        ("GET", "/v1/threads/{}/checkpoints/" + head, None),
        ("POST", "/v1/threads/{}/state", {"values": {"x": 1}}),
        ("POST", "/v1/threads/{}/fork", {"new_thread_id": "stolen"}),
        ("POST", "/v1/threads/{}/runs", {"target": "router", "from_checkpoint": head}),
        ("POST", "/v1/threads/{}/regenerate", {}),
        ("POST", "/v1/threads/{}/messages/" + last_user + "/edit", {"content": "x"}),
    ]
    for method, path, body in calls:
        thread = "chat" if "messages/" in path or "regenerate" in path else "t1"
        theirs = await beta.request(method, path.format(thread), json=body)
        missing = await beta.request(method, path.format("nope"), json=body)
        _missing_like(theirs, missing)
    assert await api.store.read("t1") == before and await api.store.read("chat") == chat_before
    assert await api.store.read("stolen") is None
    assert await api.store.list_dispatches(limit=10) == []
    # an operator acts for the owner
    r = await api.client(OPERATOR).get("/v1/threads/t1/history")
    assert r.status_code == 200 and len(r.json()["entries"]) == 3


@pytest.mark.asyncio
async def test_state_edits_are_refused_while_busy_or_without_a_graph(api: Api) -> None:
    alpha = api.client(ALPHA)
    claim = await api.store.claim("t1", "someone", 60)
    r = await alpha.post("/v1/threads/t1/state", json={"values": {"x": 1}})
    assert r.status_code == 409 and r.json()["type"].endswith(":thread-busy"), r.text
    await api.store.release("t1", claim.token)
    r = await alpha.post("/v1/threads/t1/state", json={"values": {"x": 1}, "as_node": "nobody"})
    assert r.status_code == 422 and r.json()["field"] == "as_node", r.text
    r = await alpha.post("/v1/threads/t1/state", json={"values": [1]})
    assert r.status_code == 422 and r.json()["field"] == "values", r.text
    assert len(await wakeful.history(api.store, "t1")) == 3, "nothing was committed"
    async with running_api(api.store) as bare:  # no registry: no graph to apply values with
        r = await bare.client(ALPHA).post("/v1/threads/t1/state", json={"values": {"x": 1}})
        assert r.status_code == 409 and "wakeful serve --app" in r.json()["detail"], r.text


@pytest.mark.asyncio
async def test_a_fork_copies_the_thread_for_its_tenant_and_refuses_taken_ids(api: Api) -> None:
    alpha, beta = api.client(ALPHA), api.client(BETA)
    line = await wakeful.history(api.store, "t1")
    r = await alpha.post(
        "/v1/threads/t1/fork",
        json={"new_thread_id": "t1-copy", "checkpoint_id": line[1].checkpoint_id},
    )
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/v1/threads/t1-copy"
    assert r.json()["tenant"] == "alpha" and r.json()["state"]["trail"] == ["decide"]
    assert (await beta.get("/v1/threads/t1-copy")).status_code == 404
    again = await alpha.post("/v1/threads/t1/fork", json={"new_thread_id": "t1-copy"})
    assert again.status_code == 409 and again.json()["type"].endswith(":invalid-state")
    # beta's own thread cannot be overwritten by alpha's fork, nor even be seen
    runtime = Runtime(api.store)
    await (await runtime.start("b1", router_graph(), {"x": 1}, tenant="beta")).result()
    b1 = await api.store.read("b1")
    r = await alpha.post("/v1/threads/t1/fork", json={"new_thread_id": "b1"})
    seen = await alpha.get("/v1/threads/b1")
    assert r.status_code == seen.status_code == 404 and r.json()["detail"] == seen.json()["detail"]
    assert await api.store.read("b1") == b1
    r = await alpha.post("/v1/threads/t1/fork", json={"new_thread_id": "t1"})
    assert r.status_code == 409, r.text


@pytest.mark.asyncio
async def test_a_run_from_a_checkpoint_is_queued_with_it_and_checked_first(api: Api) -> None:
    alpha = api.client(ALPHA)
    line = await wakeful.history(api.store, "t1")
    body = {"target": "router", "from_checkpoint": line[1].checkpoint_id}
    r = await alpha.post("/v1/threads/t1/runs", json=body, headers={"Idempotency-Key": "k1"})
    assert r.status_code == 202, r.text
    d = await api.store.get_dispatch(r.json()["dispatch_id"])
    assert d is not None and d.payload["from_checkpoint"] == line[1].checkpoint_id
    assert d.tenant == "alpha"
    r = await alpha.post("/v1/threads/t1/runs", json={**body, "from_checkpoint": "cp-gone"})
    assert r.status_code == 404 and "cp-gone" in r.json()["detail"]
    r = await alpha.post("/v1/threads/fresh/runs", json=body)
    assert r.status_code == 404, "nothing to replay on a thread without history"
    # a running last run refuses a replay now; a retry of the accepted one still answers
    claim = await api.store.claim("t1", "w", 60)
    running = await _mark_running(api, claim.token)
    r = await alpha.post("/v1/threads/t1/runs", json=body)
    assert r.status_code == 409 and r.json()["type"].endswith(":run-in-progress"), r.text
    r = await alpha.post("/v1/threads/t1/runs", json=body, headers={"Idempotency-Key": "k1"})
    assert r.status_code == 202 and r.json()["dispatch_id"] == d.dispatch_id
    assert running


async def _mark_running(api: Api, token: int) -> bool:
    """Commit a ``running`` head (a run in flight) under ``token``."""
    from msgspec.structs import replace

    from wakeful.records import Commit

    snap = await api.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    cp = replace(snap.checkpoint, id="live-c0", parent=snap.checkpoint.id, status="running")
    cp = replace(cp, run_id="run-live", metadata={**cp.metadata, "source": "input"})
    await api.store.commit("t1", Commit(token=token, checkpoint=cp))
    return True


@pytest.mark.asyncio
async def test_edit_and_regenerate_queue_a_replay_of_the_agent(api: Api) -> None:
    alpha = api.client(ALPHA)
    said = await api.store.messages("chat", 0, 100)
    second = said[2]
    r = await alpha.post(
        f"/v1/threads/chat/messages/{second.id}/edit",
        json={"content": "second, edited"},
        headers={"Idempotency-Key": "e1"},
    )
    assert r.status_code == 202, r.text
    edit = await api.store.get_dispatch(r.json()["dispatch_id"])
    assert edit is not None and edit.tenant == "alpha"
    assert edit.payload["target"] == "helper" and edit.payload["input"] == "second, edited"
    assert edit.payload["keep_messages"] == 2 and edit.payload["from_checkpoint"]
    again = await alpha.post(
        f"/v1/threads/chat/messages/{second.id}/edit",
        json={"content": "second, edited"},
        headers={"Idempotency-Key": "e1"},
    )
    assert again.status_code == 202 and again.json()["dispatch_id"] == edit.dispatch_id
    other = await alpha.post(
        f"/v1/threads/chat/messages/{second.id}/edit",
        json={"content": "something else"},
        headers={"Idempotency-Key": "e1"},
    )
    assert other.status_code == 409 and other.json()["type"].endswith(":dispatch-conflict")

    r = await alpha.post("/v1/threads/chat/regenerate", json={})
    assert r.status_code == 202, r.text
    regen = await api.store.get_dispatch(r.json()["dispatch_id"])
    assert regen is not None and regen.payload["from_checkpoint"] == edit.payload["from_checkpoint"]
    assert regen.payload["input"] is None and "keep_messages" not in regen.payload

    r = await alpha.post(f"/v1/threads/chat/messages/{said[1].id}/edit", json={"content": "x"})
    assert r.status_code == 422 and r.json()["field"] == "message_id", r.text
    r = await alpha.post("/v1/threads/chat/messages/m-none/edit", json={"content": "x"})
    assert r.status_code == 404, r.text
    r = await alpha.post("/v1/threads/t1/regenerate", json={})
    assert r.status_code == 422 and "needs an agent" in r.json()["detail"], r.text
    assert len(await api.store.list_dispatches(limit=10)) == 2


def test_a_graph_that_changed_is_a_conflict() -> None:
    answer = problem_for(GraphChanged("t1", "old", "new"))
    assert answer.status_code == 409
    assert b"urn:wakeful:problem:graph-changed" in bytes(answer.body)
