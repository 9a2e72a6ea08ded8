"""The newest version first (issue 40): while a fleet runs several versions, only the
workers of the version that arrived last take new starts; the others drain the work
pinned to them (decision 0035, "Versions", amendment "newest version first")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from tests.runtime_support import eventually
from tests.test_fleet_versions import approval_graph
from tests.test_fleet_worker import Env, dispatch_status
from wakeful.fleet import resume, submit
from wakeful.fleet.starts import newest_version, takes_starts
from wakeful.records import WorkerInfo
from wakeful.runtime import ClaimPolicy

FAST = ClaimPolicy(ttl=0.6, renew_every=0.2)
"""A short ttl: the start gate reads the registry every third of it (real time); the manual
clock never lets the leases lapse."""

T0 = datetime(2026, 12, 7, tzinfo=UTC)


def _worker(wid: str, version: str | None, registered: float, **more: float) -> WorkerInfo:
    at = T0 + timedelta(seconds=registered)
    beat = T0 + timedelta(seconds=more.get("beat", registered))
    stopped = more.get("stopped")
    return WorkerInfo(
        worker_id=wid,
        incarnation_id=wid,
        generation=1,
        registered_at=at,
        last_heartbeat=beat,
        stopped_at=None if stopped is None else T0 + timedelta(seconds=stopped),
        version=version,
    )


def test_the_newest_version_is_the_one_whose_first_live_worker_came_last() -> None:
    now = T0 + timedelta(seconds=100)
    fleet = [
        _worker("a", "v1", 0, beat=95),
        _worker("b", "v1", 50, beat=95),  # a later v1 worker does not make v1 newer
        _worker("c", "v2", 40, beat=95),
    ]
    assert newest_version(fleet, now, 60) == "v2"
    assert not takes_starts("v1", fleet, now, 60) and takes_starts("v2", fleet, now, 60)
    # v2's only worker stopped, or its last beat is too old: v1 is the newest again
    stopped = [*fleet[:2], _worker("c", "v2", 40, beat=95, stopped=96)]
    expired = [*fleet[:2], _worker("c", "v2", 40, beat=30)]
    for alone in (stopped, expired):
        assert newest_version(alone, now, 60) == "v1" and takes_starts("v1", alone, now, 60)
    # v1 started again after v2 (a rollback): v1 is the newest deploy
    rolled_back = [_worker("a", "v1", 70, beat=95), fleet[2]]
    assert takes_starts("v1", rolled_back, now, 60) and not takes_starts("v2", rolled_back, now, 60)
    # a worker naming no version, or one not listed yet, takes starts
    assert takes_starts(None, fleet, now, 60) and takes_starts("v3", fleet, now, 60)
    assert newest_version([_worker("n", None, 0, beat=95)], now, 60) is None


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


async def _version_of(env: Env, thread_id: str) -> str | None:
    snap = await env.store.read(thread_id)
    assert snap is not None and snap.checkpoint is not None
    version = snap.checkpoint.metadata.get("version")
    return None if version is None else str(version)


@pytest.mark.asyncio
async def test_starts_go_to_the_newest_version_while_the_old_one_drains(env: Env) -> None:
    env.registry.add("approve", approval_graph(env, "v1"))
    old = env.worker("w-v1", version="v1", claims=FAST)
    await submit(env.store, "t0", "approve", {}, dispatch_id="d0", wake=env.wake)
    await dispatch_status(env, "d0", "awaiting")
    assert await _version_of(env, "t0") == "v1"
    env.clock.advance(1)  # the deploy: v2's worker registers a second later
    new = env.worker("w-v2", version="v2", claims=FAST)
    await eventually(lambda: not old._starts.take)
    assert new._starts.take
    for n in range(1, 7):
        await submit(env.store, f"t{n}", "echo", {}, dispatch_id=f"d{n}", wake=env.wake)
    for n in range(1, 7):
        await dispatch_status(env, f"d{n}", "done")
        assert await _version_of(env, f"t{n}") == "v2", "every new start went to v2"
    assert old.stats.claimed == 1 and new.stats.claimed == 6
    # v1 still drains its own run: the answer is pinned to it and v1's code acts
    snap = await env.store.read("t0")
    assert snap is not None and snap.checkpoint is not None
    ticket = snap.checkpoint.metadata["tickets"][0]["id"]
    await resume(env.store, "t0", {ticket: "yes"}, dispatch_id="r0", wake=env.wake)
    await dispatch_status(env, "r0", "done")
    assert env.calls.get("act:v1") == 1 and old.stats.claimed == 2
    # v2 stops: v1, alone again, takes the starts
    await new.stop(grace=1)
    await eventually(lambda: old._starts.take)
    await submit(env.store, "t9", "echo", {}, dispatch_id="d9", wake=env.wake)
    await dispatch_status(env, "d9", "done")
    assert await _version_of(env, "t9") == "v1" and old.stats.claimed == 3
