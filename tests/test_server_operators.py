"""Workers, dispatches (tenant-filtered), the operator routes over really exhausted work
(quarantine, inspect, requeue, purge), health probes and metrics."""

from __future__ import annotations

import pytest

from tests.metrics_support import sample
from tests.server_support import (
    ALPHA,
    BETA,
    OPERATOR,
    exhausted_dispatch,
    keyed,
    running_api,
    seed_thread,
)
from wakeful.store.memory import MemoryStore


@pytest.mark.asyncio
async def test_workers_are_listed() -> None:
    store = MemoryStore()
    await store.register_worker("w1")
    second = await store.register_worker("w1")
    async with running_api(store) as api:
        r = await api.client(ALPHA).get("/v1/workers")
        assert r.status_code == 200
        [worker] = r.json()["workers"]
        assert worker["worker_id"] == "w1" and worker["generation"] == second.generation
        assert worker["incarnation_id"] == second.incarnation_id
        assert worker["stopped_at"] is None
        stopped = await store.retire_worker(second)
        [worker] = (await api.client(ALPHA).get("/v1/workers")).json()["workers"]
        assert stopped.stopped_at is not None
        assert worker["stopped_at"] == stopped.stopped_at.isoformat().replace("+00:00", "Z")
        assert worker["version"] is None
        await store.register_worker("w2", version="2026-12-07.1")
        listed = (await api.client(ALPHA).get("/v1/workers")).json()["workers"]
        assert {w["worker_id"]: w["version"] for w in listed} == {"w1": None, "w2": "2026-12-07.1"}


@pytest.mark.asyncio
async def test_dispatches_are_filtered_by_the_threads_tenant() -> None:
    store = MemoryStore()
    await seed_thread(store, "tb", tenant="beta")
    async with running_api(store) as api:
        alpha, beta, operator = api.client(ALPHA), api.client(BETA), api.client(OPERATOR)
        for i in range(5):
            await alpha.post(
                f"/v1/threads/ta{i}/runs",
                json={"target": "echo"},
                headers={"Idempotency-Key": f"a{i}"},
            )
            await beta.post("/v1/threads/tb/messages", json={"payload": i, "message_id": f"b{i}"})
        page = (await alpha.get("/v1/dispatches", params={"limit": 2})).json()
        ids = [d["dispatch_id"] for d in page["dispatches"]]
        while page["next_after"] is not None:
            page = (
                await alpha.get("/v1/dispatches", params={"limit": 2, "after": page["next_after"]})
            ).json()
            ids += [d["dispatch_id"] for d in page["dispatches"]]
        assert ids == [keyed("alpha", f"a{i}") for i in range(5)]
        mine = (await beta.get("/v1/dispatches", params={"thread_id": "tb"})).json()
        assert [d["dispatch_id"] for d in mine["dispatches"]] == [
            f"ext-{keyed('beta', f'b{i}')}" for i in range(5)
        ]
        assert mine["dispatches"][0]["kind"] == "message" and mine["next_after"] is None
        everything = (await operator.get("/v1/dispatches")).json()["dispatches"]
        assert len(everything) == 10
        pending = (await operator.get("/v1/dispatches", params={"status": "done"})).json()
        assert pending["dispatches"] == []
        a1, b1 = keyed("alpha", "a1"), f"ext-{keyed('beta', 'b1')}"
        assert (await alpha.get(f"/v1/dispatches/{a1}")).json()["payload"]["tenant"] == "alpha"
        assert (await alpha.get(f"/v1/dispatches/{b1}")).status_code == 404
        assert (await alpha.get("/v1/dispatches", params={"after": b1})).status_code == 404
        assert (await beta.get(f"/v1/dispatches/{b1}")).status_code == 200
        bad = await alpha.get("/v1/dispatches", params={"status": "nope"})
        assert bad.status_code == 422 and bad.json()["field"] == "status"


@pytest.mark.asyncio
async def test_exhausted_work_is_quarantined_inspected_requeued_and_purged() -> None:
    store = MemoryStore()
    await seed_thread(store, "tq", status="running")
    await exhausted_dispatch(store, "dx", "tq")
    async with running_api(store) as api:
        operator, alpha = api.client(OPERATOR), api.client(ALPHA)
        assert (await alpha.post("/v1/dispatches/dx/quarantine")).status_code == 403
        r = await operator.post("/v1/dispatches/dx/quarantine")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "quarantined" and r.json()["exhausted"] is True
        await exhausted_dispatch(store, "dy", "tq2")  # claimable now that dx is parked
        listed = (await operator.get("/v1/quarantine")).json()
        assert [d["dispatch_id"] for d in listed["dispatches"]] == ["dx"]
        inspected = (await operator.get("/v1/quarantine/dx")).json()
        assert inspected["dispatch"]["last_error"] == "boom"
        assert inspected["thread"]["status"] == "running" and inspected["thread"]["version"] == 1
        assert (await operator.get("/v1/quarantine/dy")).status_code == 404, "not quarantined"
        requeued = await operator.post("/v1/quarantine/dx/requeue")
        assert requeued.status_code == 200
        assert (requeued.json()["status"], requeued.json()["attempts"]) == ("pending", 0)
        assert (await operator.get("/v1/quarantine")).json()["dispatches"] == []
        assert (await operator.post("/v1/quarantine/dx/requeue")).status_code == 404
        assert (await operator.post("/v1/dispatches/dy/quarantine")).status_code == 200
        assert (await operator.delete("/v1/quarantine/dy")).status_code == 204
        assert await store.get_dispatch("dy") is None
        assert (await operator.delete("/v1/quarantine/dy")).status_code == 404


@pytest.mark.asyncio
async def test_quarantining_work_that_is_not_exhausted_is_409() -> None:
    store = MemoryStore()
    async with running_api(store) as api:
        alpha, operator = api.client(ALPHA), api.client(OPERATOR)
        await alpha.post(
            "/v1/threads/t1/runs", json={"target": "echo"}, headers={"Idempotency-Key": "d1"}
        )
        r = await operator.post(f"/v1/dispatches/{keyed('alpha', 'd1')}/quarantine")
        assert r.status_code == 409
        assert r.json()["type"] == "urn:wakeful:problem:invalid-state"
        assert (await operator.post("/v1/dispatches/nope/quarantine")).status_code == 404
        assert (await store.get_dispatch(keyed("alpha", "d1"))) is not None


@pytest.mark.asyncio
async def test_health_probes() -> None:
    store = MemoryStore()
    async with running_api(store) as api:
        client = api.client(None)
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/readyz")).json() == {"status": "ok"}
        await store.close()
        down = await client.get("/readyz")
        assert down.status_code == 503
        assert down.headers["content-type"] == "application/problem+json"
        assert down.headers["retry-after"] == "1"
        assert (await client.get("/healthz")).status_code == 200
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200 and sample(metrics.text, "wakeful_store_up") == 0


def _sample(text: str, name: str) -> float:
    return sample(text, name)


@pytest.mark.asyncio
async def test_metrics_count_requests_submits_conflicts_and_queue_depth() -> None:
    store = MemoryStore()
    await exhausted_dispatch(store, "dq", "tq")
    async with running_api(store, queue_depth_bound=3) as api:
        alpha, anonymous = api.client(ALPHA), api.client(None)
        key = {"Idempotency-Key": "k1"}
        await alpha.post("/v1/threads/t1/runs", json={"target": "echo"}, headers=key)
        await alpha.post("/v1/threads/t1/runs", json={"target": "other"}, headers=key)
        for i in range(4):
            await alpha.post(f"/v1/threads/u{i}/runs", json={"target": "echo"})
        await alpha.get("/v1/threads/missing")
        await anonymous.get("/v1/threads")
        await api.client(OPERATOR).post("/v1/dispatches/dq/quarantine")
        api.app.state.wakeful.metrics.leases.inc(2)
        scrape = await anonymous.get("/metrics")
        assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = scrape.text
    route = 'route="/v1/threads/{thread_id}/runs",method="POST"'
    assert _sample(text, f'wakeful_http_requests_total{{{route},status="202"}}') == 5
    assert _sample(text, f'wakeful_http_requests_total{{{route},status="409"}}') == 1
    thread = 'route="/v1/threads/{thread_id}",method="GET",status="404"'
    assert _sample(text, f"wakeful_http_requests_total{{{thread}}}") == 1
    unauth = 'route="/v1/threads",method="GET",status="401"'
    assert _sample(text, f"wakeful_http_requests_total{{{unauth}}}") == 1
    assert _sample(text, 'wakeful_submits_total{kind="start"}') == 5
    assert _sample(text, 'wakeful_conflicts_total{route="/v1/threads/{thread_id}/runs"}') == 1
    assert _sample(text, "wakeful_leases_total") == 2
    assert _sample(text, "wakeful_stale_claims_total") == 0
    assert _sample(text, 'wakeful_queue_depth{status="pending"}') == 3
    assert _sample(text, 'wakeful_queue_depth_capped{status="pending"}') == 1
    assert _sample(text, 'wakeful_queue_depth{status="quarantined"}') == 1
    assert _sample(text, 'wakeful_queue_depth_capped{status="quarantined"}') == 0
    assert _sample(text, "wakeful_store_up") == 1
    assert "# TYPE wakeful_http_requests_total counter" in text
    assert "# TYPE wakeful_queue_depth gauge" in text
