"""Time over HTTP (issue 38): delayed runs (``after``/``at``), ``not_before`` on dispatches,
a sleeping run's view, and ``/v1/schedules`` scoped to the caller's tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from tests.server_support import ALPHA, BETA, OPERATOR, Api, keyed, running_api
from wakeful import ManualClock
from wakeful.client import Client
from wakeful.errors import NotFound
from wakeful.fleet.schedules import fire_due
from wakeful.records import Checkpoint, Commit
from wakeful.server.access import tenant_scope
from wakeful.store.memory import MemoryStore

START = datetime(2026, 12, 8, 8, 59, 30, tzinfo=UTC)


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    store = MemoryStore(ManualClock(START))
    async with running_api(store) as running:
        yield running


@pytest.mark.asyncio
async def test_a_delayed_run_is_stored_now_with_not_before(api: Api) -> None:
    alpha = api.client(ALPHA)
    r = await alpha.post(
        "/v1/threads/t1/runs",
        json={"target": "echo", "after": 600},
        headers={"Idempotency-Key": "later"},
    )
    assert r.status_code == 202, r.text
    later = START + timedelta(minutes=10)
    assert datetime.fromisoformat(r.json()["not_before"]) == later
    d = await api.store.get_dispatch(keyed("alpha", "later"))
    assert d is not None and d.available_at == later
    listed = (await alpha.get("/v1/dispatches", params={"thread_id": "t1"})).json()
    assert [datetime.fromisoformat(x["not_before"]) for x in listed["dispatches"]] == [later]
    at = "2026-12-09T09:00:00+01:00"
    r = await alpha.post("/v1/threads/t2/runs", json={"target": "echo", "at": at})
    assert r.status_code == 202, r.text
    assert datetime.fromisoformat(r.json()["not_before"]) == datetime.fromisoformat(at)
    # cancelled before it is due: the dispatch is retired, nothing of it can run
    assert (await alpha.post("/v1/threads/t1/cancel", json={})).status_code == 202
    d = await api.store.get_dispatch(keyed("alpha", "later"))
    assert d is not None and d.status == "done"


@pytest.mark.asyncio
async def test_delays_are_validated(api: Api) -> None:
    alpha = api.client(ALPHA)
    for body in (
        {"target": "echo", "after": 5, "at": "2026-12-09T09:00:00Z"},
        {"target": "echo", "at": "2026-12-09T09:00:00"},  # no time zone
        {"target": "echo", "after": -1},
        {"target": "echo", "after": 10**12},
        {"target": "echo", "at": "2999-01-01T00:00:00Z"},
        {"target": "echo", "after": None},
    ):
        r = await alpha.post("/v1/threads/t1/runs", json=body)
        assert r.status_code == 422, (body, r.text)
    assert await api.store.list_dispatches() == []


@pytest.mark.asyncio
async def test_a_sleeping_run_shows_sleeping_with_its_wake_time(api: Api) -> None:
    claim = await api.store.claim("t1", "rt", 30, tenant="alpha")
    wake = START + timedelta(days=3)
    # what ctx.sleep records: its ticket, and the wake time
    sleep_ticket = {
        "id": "s0-t0-s1",
        "task_id": "s0-t0",
        "node": "nap",
        "question": {"sleep_until": wake.isoformat()},
        "schema": "wakeful.sleep",
    }
    cp = Checkpoint(
        id="run-1-c1",
        parent=None,
        run_id="run-1",
        status="suspended",
        state={},
        created_at=START,
        tenant="alpha",
        metadata={"wake_at": wake.isoformat(), "tickets": [sleep_ticket]},
    )
    await api.store.commit("t1", Commit(token=claim.token, checkpoint=cp, release=True))
    view = (await api.client(ALPHA).get("/v1/threads/t1")).json()
    assert view["status"] == "sleeping"
    assert datetime.fromisoformat(view["wake_at"]) == wake
    [run] = (await api.client(ALPHA).get("/v1/threads/t1/runs")).json()["runs"]
    assert run["run_id"] == "run-1" and run["status"] == "sleeping"
    assert datetime.fromisoformat(run["wake_at"]) == wake
    # woken and ended: an ordinary run again
    claim = await api.store.claim("t1", "rt", 30, tenant="alpha")
    done = Checkpoint(
        id="run-1-c2",
        parent=cp.id,
        run_id="run-1",
        status="completed",
        state={},
        created_at=START,
        tenant="alpha",
        metadata={"wake_at": wake.isoformat()},
    )
    await api.store.commit("t1", Commit(token=claim.token, checkpoint=done, release=True))
    [run] = (await api.client(ALPHA).get("/v1/threads/t1/runs")).json()["runs"]
    assert run["status"] == "completed" and run["wake_at"] is None


@pytest.mark.asyncio
async def test_schedules_are_the_callers_own(api: Api) -> None:
    alpha, beta, operator = api.client(ALPHA), api.client(BETA), api.client(OPERATOR)
    body = {"target": "echo", "cron": "0 9 * * MON-FRI", "thread_template": "digest-{date}"}
    r = await alpha.put("/v1/schedules/digest", json=body)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["name"] == "digest" and view["tenant"] == "alpha" and view["revision"] == 1
    assert datetime.fromisoformat(view["next_fire_at"]) == datetime(2026, 12, 8, 9, tzinfo=UTC)
    stored = f"{tenant_scope('alpha')}.digest"
    assert (await api.store.get_schedule(stored)) is not None
    # beta has a namespace of its own: the same name is another schedule, alpha's is 404
    assert (await beta.get("/v1/schedules/digest")).status_code == 404
    assert (await beta.post("/v1/schedules/digest/trigger")).status_code == 404
    assert (await beta.put("/v1/schedules/digest", json=body)).status_code == 200
    assert [s["name"] for s in (await alpha.get("/v1/schedules")).json()["schedules"]] == ["digest"]
    listed = (await operator.get("/v1/schedules")).json()["schedules"]
    assert sorted(s["tenant"] for s in listed) == ["alpha", "beta"]
    # pause, resume, trigger, delete
    assert (await alpha.post("/v1/schedules/digest/pause")).json()["paused"] is True
    assert (await alpha.post("/v1/schedules/digest/resume")).json()["paused"] is False
    r = await alpha.post("/v1/schedules/digest/trigger")
    assert r.status_code == 202, r.text
    triggered = await api.store.get_dispatch(r.json()["dispatch_id"])
    assert triggered is not None and triggered.tenant == "alpha"
    assert triggered.thread_id == "digest-2026-12-08"
    assert (await alpha.delete("/v1/schedules/digest")).status_code == 204
    assert (await alpha.get("/v1/schedules/digest")).status_code == 404
    assert (await beta.get("/v1/schedules/digest")).status_code == 200


@pytest.mark.asyncio
async def test_a_schedule_fires_for_its_tenant(api: Api) -> None:
    alpha = api.client(ALPHA)
    body = {"target": "echo", "every": 60, "thread": "t-alpha", "input": {"n": 1}}
    assert (await alpha.put("/v1/schedules/minutely", json=body)).status_code == 200
    assert isinstance(api.store, MemoryStore)
    clock = api.store._clock
    assert isinstance(clock, ManualClock)
    clock.set(START + timedelta(seconds=30))
    fired = await fire_due(api.store)
    assert [(d.thread_id, d.tenant, d.payload["input"]) for d in fired] == [
        ("t-alpha", "alpha", {"n": 1})
    ]
    # another tenant's thread cannot be named
    r = await api.client(BETA).put("/v1/schedules/x", json={**body, "thread": "t-alpha"})
    assert r.status_code == 404, r.text


@pytest.mark.asyncio
async def test_a_schedule_definition_is_checked_over_http(api: Api) -> None:
    alpha = api.client(ALPHA)
    for body in (
        {"target": "echo", "cron": "not cron", "thread": "t"},
        {"target": "echo", "cron": "0 9 * * *", "timezone": "Nowhere/City", "thread": "t"},
        {"target": "echo", "cron": "0 9 * * *", "every": 5, "thread": "t"},
        {"target": "echo", "every": 5},
        {"target": "echo", "every": 5, "thread_template": "x-{nope}"},
        {"target": "echo", "every": 5, "thread": "t", "extra": 1},
        {"target": "echo", "every": 5, "thread": "t", "cron": None},
    ):
        r = await alpha.put("/v1/schedules/s", json=body)
        assert r.status_code == 422, (body, r.text)
    assert (await alpha.get("/v1/schedules")).json()["schedules"] == []


@pytest.mark.asyncio
async def test_the_client_delays_runs_and_manages_schedules(api: Api) -> None:
    async with Client(api.url, ALPHA) as client:
        accepted = await client.runs.create("t1", "echo", after=timedelta(minutes=5))
        assert datetime.fromisoformat(accepted["not_before"]) == START + timedelta(minutes=5)
        at = START + timedelta(days=1)
        accepted = await client.runs.create("t2", "echo", at=at)
        assert datetime.fromisoformat(accepted["not_before"]) == at
        view = await client.schedules.put("daily", "echo", cron="0 9 * * *", thread="t3")
        assert view["name"] == "daily" and view["tenant"] == "alpha"
        assert (await client.schedules.pause("daily"))["paused"] is True
        assert [s["name"] for s in (await client.schedules.list())["schedules"]] == ["daily"]
        fired = await client.schedules.trigger("daily")
        assert fired["thread_id"] == "t3"
        await client.schedules.delete("daily")
        with pytest.raises(NotFound):
            await client.schedules.get("daily")
