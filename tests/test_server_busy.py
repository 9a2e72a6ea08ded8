"""Busy threads over HTTP (issue 36): ``if_busy`` on ``POST /v1/threads/{id}/runs`` and
``/messages``: 202 with ``queued_behind`` while the thread is busy, 409 ``thread-busy``
naming the busy run for ``reject`` (nothing stored), 202 for ``rollback``; and the Python
client's ``if_busy``, which raises ``ThreadBusy`` as the store does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.server_support import ALPHA, Api, running_api
from wakeful.client import Client
from wakeful.errors import ThreadBusy
from wakeful.store.memory import MemoryStore

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api(MemoryStore()) as running:
        yield running


async def test_runs_and_messages_take_if_busy(api: Api) -> None:
    alpha = api.client(ALPHA)
    first = await alpha.post("/v1/threads/t1/runs", json={"target": "echo"}, headers={
        "Idempotency-Key": "d-1"
    })  # fmt: skip
    assert first.status_code == 202 and first.json()["queued_behind"] is None
    # an Idempotency-Key is scoped to its caller: the dispatch ids are the server's
    d1 = first.json()["dispatch_id"]
    queued = await alpha.post(
        "/v1/threads/t1/runs", json={"target": "echo", "if_busy": "enqueue"},
        headers={"Idempotency-Key": "d-2"},
    )  # fmt: skip
    assert queued.status_code == 202, queued.text
    assert (queued.json()["status"], queued.json()["queued_behind"]) == ("queued", d1)
    d2 = queued.json()["dispatch_id"]

    refused = await alpha.post(
        "/v1/threads/t1/runs", json={"target": "echo", "if_busy": "reject"},
        headers={"Idempotency-Key": "d-3"},
    )  # fmt: skip
    assert refused.status_code == 409, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    problem = refused.json()
    assert problem["type"] == "urn:wakeful:problem:thread-busy"
    assert (problem["run_id"], problem["dispatch_id"]) == (first.json()["run_id"], d1)
    assert len(await api.store.list_dispatches(thread_id="t1")) == 2, "nothing stored"

    message = await alpha.post(
        "/v1/threads/t1/messages", json={"payload": "hi", "if_busy": "coalesce"}
    )
    assert message.status_code == 202, message.text
    assert (message.json()["status"], message.json()["queued_behind"]) == ("queued", d2)
    stored = await api.store.get_dispatch(message.json()["dispatch_id"])
    assert stored is not None and stored.if_busy == "coalesce"
    listed = await alpha.get("/v1/dispatches", params={"thread_id": "t1", "status": "queued"})
    assert listed.status_code == 200, listed.text
    assert [d["if_busy"] for d in listed.json()["dispatches"]] == ["enqueue", "coalesce"]

    rollback = await alpha.post(
        "/v1/threads/t1/runs", json={"target": "echo", "if_busy": "rollback"},
        headers={"Idempotency-Key": "d-r"},
    )  # fmt: skip
    assert rollback.status_code == 202, rollback.text
    assert rollback.json()["status"] == "queued"
    stored = await api.store.get_dispatch(rollback.json()["dispatch_id"])
    assert stored is not None and stored.if_busy == "rollback"
    [intent] = await api.store.list_dispatches(status="pending", thread_id="t1")
    assert intent.kind == "cancel" and intent.payload["rollback"] is True
    unknown = await alpha.post("/v1/threads/t1/runs", json={"target": "echo", "if_busy": "x"})
    assert unknown.status_code == 422


async def test_the_client_raises_thread_busy_naming_the_busy_run(api: Api) -> None:
    async with Client(api.url, ALPHA) as client:
        first = await client.runs.create("t1", "echo", idempotency_key="d-1")
        d1 = first["dispatch_id"]
        with pytest.raises(ThreadBusy) as refused:
            await client.runs.create("t1", "echo", if_busy="reject")
        assert (refused.value.run_id, refused.value.dispatch_id) == (first["run_id"], d1)
        queued = await client.messages.send("t1", "again", if_busy="interrupt")
        assert queued["status"] == "queued" and queued["queued_behind"] == d1
    d = await api.store.get_dispatch(d1)
    assert d is not None and d.status == "done", "the interrupt fenced the busy run"
