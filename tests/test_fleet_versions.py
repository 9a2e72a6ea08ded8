"""Versioned workers (issue 40): a worker registers its code version, every run it starts
records it, and the default version is a hash of the code it runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.runtime_support import eventually
from tests.test_fleet_worker import Env, State, dispatch_status
from wakeful.fleet import Registry, resume, submit
from wakeful.fleet.versions import code_version
from wakeful.metrics import Metrics
from wakeful.runtime import START, Graph, NodeContext


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


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


def approval_graph(env: Env, deploy: str, gate: asyncio.Event | None = None) -> Any:
    """Ask for approval, then act: the same structure in every deploy (``deploy`` names the
    code that ran ``act``; with ``gate``, the first call of ``act`` waits for it)."""

    def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"log": [f"asked:{ctx.interrupt('ok?')}"]}

    async def act(state: dict[str, Any]) -> dict[str, Any]:
        env.calls[f"act:{deploy}"] = env.calls.get(f"act:{deploy}", 0) + 1
        if gate is not None and env.calls[f"act:{deploy}"] == 1:
            await gate.wait()
        return {"log": [f"act:{deploy}"]}

    g = Graph(State, name="approve").node("ask", ask).node("act", act)
    return g.edge(START, "ask").edge("ask", "act").compile()


async def _suspended_on_v1(env: Env) -> None:
    env.registry.add("approve", approval_graph(env, "v1"))
    old = env.worker("w-v1", version="v1", pin_grace=5)
    await submit(env.store, "t1", "approve", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "awaiting")
    await old.stop(grace=1)


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", [None, "fail", "hold"])
async def test_a_run_whose_version_left_moves_by_its_policy(env: Env, policy: Any) -> None:
    await _suspended_on_v1(env)
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.metadata["version"] == "v1"
    ticket = snap.checkpoint.metadata["tickets"][0]["id"]
    answer = await resume(env.store, "t1", {ticket: "yes"}, dispatch_id="r1", wake=env.wake)
    assert answer.pinned_version == "v1"
    # the deploy: v2's code, the same graph structure
    env.registry = Registry(default="echo")
    env.registry.add("approve", approval_graph(env, "v2"), on_version_change=policy)
    new = env.worker("w-v2", version="v2", pin_grace=5)
    polls = new.stats.polls
    await eventually(lambda: _true(new.stats.polls >= polls + 3))
    assert (await env.dispatch("r1")).status == "pending", "v1 stopped only 0 s ago"
    env.clock.advance(6)  # no v1 worker for longer than the pin grace
    events = []
    if policy is None:  # the same structure: continue on v2
        await dispatch_status(env, "r1", "done")
        assert await env.status("t1") == "completed"
        assert env.calls.get("act:v2") == 1 and "act:v1" not in env.calls
        events = [
            e for e in await env.store.events_after("t1", 0, 100) if e.type == "run.version_changed"
        ]
    elif policy == "fail":
        await dispatch_status(env, "r1", "done")
        assert await env.status("t1") == "failed"
        failed = [e for e in await env.store.events_after("t1", 0, 100) if e.type == "run.failed"]
        assert "version v1" in failed[0].data["reason"] and "v2" in failed[0].data["reason"]
        events = failed
        assert env.calls == {}
    else:
        await dispatch_status(env, "r1", "quarantined")
        assert await env.status("t1") == "suspended", "held as it was, for an operator"
        events = [e for e in await env.store.events_after("t1", 0, 100) if e.type == "run.held"]
        assert env.calls == {}
    assert len(events) == 1, "moved once"
    assert events[0].data["from"] == "v1" and events[0].data["to"] == "v2"
    assert events[0].data["policy"] == (policy or "continue")


async def _true(value: bool) -> bool:
    return value


@pytest.mark.asyncio
async def test_a_move_is_recorded_once_when_its_attempt_is_recovered(env: Env) -> None:
    await _suspended_on_v1(env)
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    ticket = snap.checkpoint.metadata["tickets"][0]["id"]
    await resume(env.store, "t1", {ticket: "yes"}, dispatch_id="r1", wake=env.wake)
    gate = asyncio.Event()  # the first v2 attempt hangs in ``act`` ...
    env.registry = Registry(default="echo")
    env.registry.add("approve", approval_graph(env, "v2", gate))
    env.worker("w-v2a", version="v2", pin_grace=5)
    env.clock.advance(6)
    await eventually(lambda: _true(env.calls.get("act:v2") == 1))
    env.clock.advance(31)  # ... and its worker is gone: the lease lapses
    env.worker("w-v2b", version="v2", pin_grace=5)
    await eventually(lambda: _true(env.calls.get("act:v2") == 2))
    await dispatch_status(env, "r1", "done")
    assert await env.status("t1") == "completed"
    events = await env.store.events_after("t1", 0, 100)
    moved = [e for e in events if e.type == "run.version_changed"]
    assert len(moved) == 1, "the second attempt of the move found the first one's receipt"
    gate.set()


def napping_graph(env: Env, deploy: str) -> Any:
    """Sleep durably for 10 s, then act (the same structure in every deploy)."""

    async def nap(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        await ctx.sleep(10)
        return {"log": ["woke"]}

    async def act(state: dict[str, Any]) -> dict[str, Any]:
        env.calls[f"act:{deploy}"] = env.calls.get(f"act:{deploy}", 0) + 1
        return {"log": [f"act:{deploy}"]}

    g = Graph(State, name="nap").node("nap", nap).node("act", act)
    return g.edge(START, "nap").edge("nap", "act").compile()


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", [None, "fail", "hold"])
async def test_a_sleeping_run_whose_version_left_moves_by_its_policy(env: Env, policy: Any) -> None:
    env.registry.add("nap", napping_graph(env, "v1"))
    old = env.worker("w-v1", version="v1", pin_grace=5)
    await submit(env.store, "t1", "nap", {}, dispatch_id="d1", wake=env.wake)
    await eventually(lambda: _asleep(env, "t1"))
    await old.stop(grace=1)
    env.registry = Registry(default="echo")
    env.registry.add("nap", napping_graph(env, "v2"), on_version_change=policy)
    env.worker("w-v2", version="v2", pin_grace=5)
    env.clock.advance(11)  # due to wake, and v1 gone for longer than the pin grace
    if policy == "hold":
        await dispatch_status(env, "d1", "quarantined")
    else:
        await dispatch_status(env, "d1", "done")
    types = [e.type for e in await env.store.events_after("t1", 0, 100)]
    expected = {None: "run.version_changed", "fail": "run.failed", "hold": "run.held"}[policy]
    assert types.count(expected) == 1, types
    if policy is None:
        assert await env.status("t1") == "completed" and env.calls == {"act:v2": 1}
    else:
        assert env.calls == {}, "neither version's code ran on"


async def _asleep(env: Env, thread_id: str) -> bool:
    snap = await env.store.read(thread_id)
    cp = snap.checkpoint if snap is not None else None
    return cp is not None and cp.status != "running" and cp.metadata.get("tickets") is not None
