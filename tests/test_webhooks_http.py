"""Webhooks through the HTTP API and its Python client (issue 43): ``webhook`` on a run
submission, the deliveries a tenant sees at ``GET /v1/webhooks``, the ``wakeful_webhooks``
gauge of ``/metrics``, and URLs with credentials refused (422, not echoed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from tests.server_support import ALPHA, BETA, OPERATOR, Api, approval_graph, echo_graph, running_api
from tests.webhook_support import receiver, until
from wakeful import InvalidInput
from wakeful.agent import Agent
from wakeful.client import Client
from wakeful.fleet import LocalWake, Registry, Worker
from wakeful.fleet.webhook_signing import new_secret, verify
from wakeful.fleet.webhooks import WebhookConfig
from wakeful.providers.scripted import Scripted
from wakeful.store.memory import MemoryStore

pytestmark = pytest.mark.asyncio
SECRET = new_secret()


@asynccontextmanager
async def fleet() -> AsyncIterator[Api]:
    store = MemoryStore()
    wake = LocalWake()
    registry = Registry().add("echo", echo_graph()).add("approval", approval_graph())
    registry.add("helper", Agent("helper", Scripted.replies("It left the depot.")))
    config = WebhookConfig(secrets=(SECRET,), allow_private=True)
    worker = Worker(store, registry, wake=wake, poll_interval=0.05, webhooks=config)
    running = asyncio.create_task(worker.run())
    try:
        async with running_api(store, registry=registry, wake=wake) as api:
            yield api
    finally:
        await worker.stop(2)
        await running


async def listed(api: Api, token: str) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=api.url) as http:
        answer = await http.get("/v1/webhooks", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200, answer.text
        found: dict[str, object] = answer.json()
        return found


async def test_a_run_submitted_with_a_webhook_over_http_is_delivered_and_listed() -> None:
    with receiver() as got:
        async with fleet() as api, Client(api.url, ALPHA) as alpha:
            done = await alpha.runs.create("t1", "echo", webhook=got.url)
            asked = await alpha.runs.create("t2", "approval", webhook=got.url)
            told = await alpha.runs.create("t4", "helper", "Where is it?", webhook=got.url)
            await until(lambda: got.count() == 3, "the three webhooks")
            for _ in range(200):  # the deliveries' records follow the POSTs
                page = await listed(api, ALPHA)
                if page["counts"] == {"pending": 0, "delivered": 3, "dead": 0}:
                    break
                await asyncio.sleep(0.02)
            assert page["counts"] == {"pending": 0, "delivered": 3, "dead": 0}
            rows = page["webhooks"]
            assert isinstance(rows, list) and len(rows) == 3
            runs = {done["run_id"], asked["run_id"], told["run_id"]}
            assert {r["run_id"] for r in rows} == runs
            assert all(r["url"].endswith("/hook?…") and r["attempts"] == 1 for r in rows)
            assert (await listed(api, BETA))["webhooks"] == [], "another tenant's are hidden"
            assert len((await listed(api, OPERATOR))["webhooks"]) == 3  # type: ignore[arg-type]
            async with httpx.AsyncClient(base_url=api.url) as http:
                text = (await http.get("/metrics")).text
            assert 'wakeful_webhooks{status="delivered"} 3.0' in text
            with pytest.raises(InvalidInput) as refused:
                await alpha.runs.create("t3", "echo", webhook="https://me:hunter2@example.com/")
            assert "hunter2" not in str(refused.value)
    bodies = {json.loads(r.body)["data"]["thread_id"]: json.loads(r.body) for r in got.requests}
    assert bodies["t1"]["type"] == "run.completed"
    assert bodies["t2"]["type"] == "run.suspended"
    assert [t["question"] for t in bodies["t2"]["data"]["tickets"]] == ["ship it?"]
    assert bodies["t4"]["data"]["output"] == "It left the depot.", "an agent's final answer"
    for r in got.requests:
        assert verify(SECRET, r.headers, r.body, now=float(r.headers["webhook-timestamp"]))
