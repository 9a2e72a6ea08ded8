"""The fleet's versions over HTTP (issue 40): GET /v1/versions lists each version with its
live workers and pinned runs; POST /v1/versions/migrate moves a version's runs."""

from __future__ import annotations

import pytest

from tests.server_support import ALPHA, OPERATOR, running_api
from wakeful.records import Awaiting, Dispatch, Retry
from wakeful.store.memory import MemoryStore


async def _pinned(store: MemoryStore, version: str, threads: list[str], settle: bool) -> None:
    for tid in threads:
        await store.enqueue(Dispatch(dispatch_id=f"d-{tid}", thread_id=tid, kind="start"))
    leases = await store.claim_next(f"w-{version}", 30, len(threads), version=version)
    assert len(leases) == len(threads)
    for n, lease in enumerate(leases if settle else []):
        outcome = Awaiting() if n == 0 else Retry(0.0, "again")
        await store.settle(lease.dispatch.dispatch_id, lease.claim.token, outcome)


@pytest.mark.asyncio
async def test_versions_are_listed_and_their_runs_moved_by_operators() -> None:
    store = MemoryStore()
    await store.register_worker("w-v1", version="v1")
    await _pinned(store, "v1", ["t1", "t2"], settle=True)
    await store.register_worker("w-v2", version="v2")
    await _pinned(store, "v2", ["t3"], settle=False)
    gone = await store.register_worker("w-v0", version="v0")
    await store.retire_worker(gone)
    async with running_api(store) as api:
        operator, alpha = api.client(OPERATOR), api.client(ALPHA)
        assert (await alpha.get("/v1/versions")).status_code == 403
        r = await operator.get("/v1/versions")
        assert r.status_code == 200, r.text
        listed = [
            (v["version"], v["live_workers"], v["workers"], v["newest"], v["pinned_runs"])
            for v in r.json()["versions"]
        ]
        assert listed == [("v2", 1, 1, True, 1), ("v1", 1, 1, False, 2), ("v0", 0, 1, False, 0)]
        assert r.json()["bounded"] is False
        assert (
            await alpha.post("/v1/versions/migrate", json={"from": "v1", "to": "v2"})
        ).status_code == 403
        same = await operator.post("/v1/versions/migrate", json={"from": "v1", "to": "v1"})
        assert same.status_code == 409 and "name another" in same.json()["detail"]
        stopped = await operator.post("/v1/versions/migrate", json={"from": "v1", "to": "v0"})
        assert stopped.status_code == 404, "no running worker of v0"
        moved = await operator.post("/v1/versions/migrate", json={"from": "v1", "to": "v2"})
        assert moved.status_code == 200, moved.text
        assert sorted(d["dispatch_id"] for d in moved.json()["moved"]) == ["d-t1", "d-t2"]
        again = await operator.post("/v1/versions/migrate", json={"from": "v1", "to": "v2"})
        assert again.status_code == 200 and again.json()["moved"] == []
        after = {
            v["version"]: v["pinned_runs"]
            for v in (await operator.get("/v1/versions")).json()["versions"]
        }
        assert after == {"v2": 3, "v1": 0, "v0": 0}
    events = await store.events_after("t1", 0, 10)
    assert [(e.type, e.data["from"], e.data["to"]) for e in events] == [
        ("run.migrated", "v1", "v2")
    ]
