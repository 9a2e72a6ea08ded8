"""Versioned workers (issue 40): a worker registers its code version, every run it starts
records it, and the default version is a hash of the code it runs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_fleet_worker import Env, State, dispatch_status, env  # noqa: F401 - the fixture
from wakeful.fleet import Registry, submit
from wakeful.fleet.versions import code_version
from wakeful.metrics import Metrics
from wakeful.runtime import START, Graph


@pytest.mark.asyncio
async def test_a_run_records_the_version_of_the_worker_that_started_it(env: Env) -> None:
    worker = env.worker("w1", version="2026-12-07.1")
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "done")
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.metadata["version"] == "2026-12-07.1"
    events = await env.store.events_after("t1", 0, 100)
    started = [e.data for e in events if e.type == "run.started"]
    assert started == [{"graph": "echo", "version": "2026-12-07.1"}]
    listed = {w.worker_id: w.version for w in await env.store.list_workers()}
    assert listed == {"w1": "2026-12-07.1"}
    metrics: Metrics = worker.metrics
    assert 'wakeful_worker_info{version="2026-12-07.1"} 1.0' in metrics.render()


def _registry(patches: list[str], extra: bool = False) -> Registry:
    def a(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    g = Graph(State, name="g", patches=patches).node("a", a).edge(START, "a")
    if extra:
        g.node("b", a).edge("a", "b")
    return Registry().add("g", g.compile())


def test_the_default_version_follows_the_code() -> None:
    same = code_version(_registry([]))
    assert same == code_version(_registry([])), "an unchanged deploy keeps its version"
    assert same.startswith("code-")
    assert code_version(_registry(["fix-1"])) != same, "a declared patch is a new version"
    assert code_version(_registry([], extra=True)) != same, "so is a changed graph"
    assert code_version(_registry([]), modules=["json"]) != same, "and the app's module"
