"""Tenant isolation under concurrency (issue 16 §1), through a real server on loopback:
two tenants submitting to the same new thread at once get exactly one 202 and one 404, and
nothing of the loser's input is stored; work refused or exhausted on a new thread stays its
submitter's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.postgres_support import Databases, open_test_store
from tests.runtime_support import eventually
from tests.server_support import ALPHA, BETA, OPERATOR, Api, registry, running_api
from tests.sqlite_support import sqlite_url
from wakeful import open_store
from wakeful.fleet import LocalWake, Worker, client
from wakeful.records import Retry
from wakeful.runtime.claims import ClaimPolicy
from wakeful.store.contract import Store

pytest_plugins = ["tests.postgres_fixtures"]

PAIRS = 15


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def databases(request: pytest.FixtureRequest) -> Databases | None:
    """PostgreSQL databases for the ``postgres`` run (resolved outside the event loop, as
    the template is built with ``asyncio.run``), ``None`` for SQLite."""
    if request.param == "sqlite":
        return None
    found: Databases = request.getfixturevalue("pg_databases")
    return found


@pytest_asyncio.fixture
async def store(databases: Databases | None, tmp_path: Path) -> AsyncIterator[Store]:
    """A store whose calls really suspend (a thread pool, a socket), so two requests'
    check and write interleave as they do in production."""
    if databases is None:
        async with open_store(sqlite_url(tmp_path / "store.db")) as opened:
            yield opened
        return
    pg = await open_test_store(await databases.clone())
    try:
        yield pg
    finally:
        await pg.close()


async def _submit(caller: httpx.AsyncClient, thread_id: str, secret: str) -> httpx.Response:
    return await caller.post(
        f"/v1/threads/{thread_id}/runs", json={"target": "echo", "input": {"log": [secret]}}
    )


async def _everything(operator: httpx.AsyncClient, path: str, key: str) -> list[dict[str, object]]:
    """Every row of an operator listing, page by page."""
    rows: list[dict[str, object]] = []
    after: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 100, **({"after": after} if after else {})}
        page = (await operator.get(path, params=params)).json()
        rows += page[key]
        after = page["next_after"]
        if after is None:
            return rows


@pytest.mark.asyncio
async def test_two_tenants_racing_for_a_new_thread_one_wins_nothing_of_the_other_stored(
    store: Store,
) -> None:
    wake = LocalWake()
    worker = Worker(
        store,
        registry(),
        concurrency=4,
        claims=ClaimPolicy(ttl=30, renew_every=10),
        wake=wake,
        poll_interval=0.05,
        retry_backoff=0.0,
    )
    working = asyncio.create_task(worker.run())
    try:
        async with running_api(store, wake=wake) as api:
            await _race(api)
    finally:
        await worker.stop(grace=5)
        await asyncio.wait_for(working, 10)


async def _race(api: Api) -> None:
    callers = {"alpha": api.client(ALPHA), "beta": api.client(BETA)}
    operator = api.client(OPERATOR)
    winners: dict[str, tuple[str, str]] = {}
    for pair in range(PAIRS):
        thread_id = f"race-{pair}"
        secrets = {tenant: f"{tenant}-secret-{pair}" for tenant in callers}
        answers = await asyncio.gather(
            *(_submit(callers[t], thread_id, secrets[t]) for t in callers)
        )
        by_tenant = dict(zip(callers, answers, strict=True))
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [202, 404], [(t, r.status_code, r.text) for t, r in by_tenant.items()]
        winner = next(t for t, r in by_tenant.items() if r.status_code == 202)
        loser = next(t for t in callers if t != winner)
        refused = by_tenant[loser].json()
        missing = (await callers[loser].get("/v1/threads/never-used")).json()
        assert refused["type"] == missing["type"] and refused["status"] == 404
        assert refused["detail"] == missing["detail"].replace("never-used", thread_id)
        winners[thread_id] = (winner, by_tenant[winner].json()["dispatch_id"])

    async def all_ran() -> bool:
        for thread_id in winners:
            view = (await operator.get(f"/v1/threads/{thread_id}")).json()
            if view.get("status") != "completed":
                return False
        return True

    await eventually(all_ran, deadline=60)
    dispatches = await _everything(operator, "/v1/dispatches", "dispatches")
    assert sorted(str(d["dispatch_id"]) for d in dispatches) == sorted(
        dispatch_id for _, dispatch_id in winners.values()
    ), "exactly the winners' work was stored"
    for thread_id, (winner, dispatch_id) in winners.items():
        loser = "beta" if winner == "alpha" else "alpha"
        view = (await callers[winner].get(f"/v1/threads/{thread_id}")).json()
        assert view["tenant"] == winner
        assert view["state"]["log"] == [f"{winner}-secret-{thread_id.split('-')[1]}", "echo"]
        events = (await operator.get(f"/v1/threads/{thread_id}/events")).json()["events"]
        assert events and all(f"{loser}-secret-" not in str(e) for e in events)
        assert all(dispatch_id in str(e) or "dispatch_id" not in str(e) for e in events)
        mine = (await callers[winner].get("/v1/dispatches", params={"thread_id": thread_id})).json()
        assert [d["dispatch_id"] for d in mine["dispatches"]] == [dispatch_id]
        other = await callers[loser].get("/v1/dispatches", params={"thread_id": thread_id})
        assert other.status_code == 404
    stored = str(dispatches)
    for thread_id, (winner, _) in winners.items():
        number = thread_id.split("-")[1]
        loser = "beta" if winner == "alpha" else "alpha"
        assert f"'{winner}-secret-{number}'" in stored
        assert f"'{loser}-secret-{number}'" not in stored, "the loser's input is nowhere"


# -------------------------------------------------- refused or exhausted on a new thread


@pytest_asyncio.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Api, Worker]]:
    """The API and a worker over one SQLite file (the server knows no registry, so it
    accepts a target only the worker can judge)."""
    async with open_store(sqlite_url(tmp_path / "store.db")) as store:
        wake = LocalWake()
        worker = Worker(
            store,
            registry(),
            claims=ClaimPolicy(ttl=30, renew_every=10),
            wake=wake,
            poll_interval=0.05,
            retry_backoff=0.0,
        )
        working = asyncio.create_task(worker.run())
        try:
            async with running_api(store, wake=wake) as api:
                yield api, worker
        finally:
            await worker.stop(grace=5)
            await asyncio.wait_for(working, 10)


async def _settled(caller: httpx.AsyncClient, dispatch_id: str) -> None:
    async def done() -> bool:
        answer = await caller.get(f"/v1/dispatches/{dispatch_id}")
        return answer.status_code == 200 and answer.json()["status"] == "done"

    await eventually(done, deadline=30)


@pytest.mark.asyncio
async def test_work_refused_on_a_new_thread_stays_its_submitters(
    fleet: tuple[Api, Worker],
) -> None:
    api, _ = fleet
    alpha, operator = api.client(ALPHA), api.client(OPERATOR)
    submitted = await alpha.post("/v1/threads/fresh/runs", json={"target": "no-such-target"})
    assert submitted.status_code == 202
    dispatch_id = submitted.json()["dispatch_id"]
    await _settled(operator, dispatch_id)
    thread = await alpha.get("/v1/threads/fresh")
    assert thread.status_code == 200 and thread.json()["tenant"] == "alpha"
    assert thread.json()["version"] == 1
    events = (await alpha.get("/v1/threads/fresh/events")).json()["events"]
    assert [e["type"] for e in events] == ["dispatch.refused"]
    assert (await alpha.get(f"/v1/dispatches/{dispatch_id}")).status_code == 200
    again = await alpha.post("/v1/threads/fresh/runs", json={"target": "echo"})
    assert again.status_code == 202, "the thread is still the submitter's to use"
    beta = await api.client(BETA).post("/v1/threads/fresh/runs", json={"target": "echo"})
    assert beta.status_code == 404


@pytest.mark.asyncio
async def test_work_exhausted_on_a_new_thread_stays_its_submitters(
    fleet: tuple[Api, Worker],
) -> None:
    api, worker = fleet
    alpha, operator = api.client(ALPHA), api.client(OPERATOR)
    await worker.stop(grace=5)  # spend the budget by hand first
    d = await client.submit(api.store, "spent", "echo", tenant="alpha", max_attempts=1)
    for _ in range(2):
        [lease] = await api.store.claim_next("by-hand", 30)
        await api.store.settle(d.dispatch_id, lease.claim.token, Retry(0.0, "boom"))
    rerun = Worker(api.store, registry(), poll_interval=0.05, retry_backoff=0.0)
    working = asyncio.create_task(rerun.run())
    try:
        await _settled(operator, d.dispatch_id)
    finally:
        await rerun.stop(grace=5)
        await asyncio.wait_for(working, 10)
    thread = await alpha.get("/v1/threads/spent")
    assert thread.status_code == 200 and thread.json()["tenant"] == "alpha"
    events = (await alpha.get("/v1/threads/spent/events")).json()["events"]
    assert [e["type"] for e in events] == ["run.indeterminate"]
    assert (await alpha.get(f"/v1/dispatches/{d.dispatch_id}")).status_code == 200
