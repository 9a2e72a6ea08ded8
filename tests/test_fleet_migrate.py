"""``wakeful runs migrate`` (issue 40): an operator moves the runs of one version to another;
each moved run gets a ``run.migrated`` event, and the new version's workers continue it on
their code even when its graph structure changed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.cli_support import cli, error_line
from tests.test_fleet_versions import approval_graph
from tests.test_fleet_worker import Env, State, dispatch_status
from wakeful import open_store
from wakeful.fleet import Registry, resume, submit
from wakeful.records import Awaiting, Commit, EventDraft
from wakeful.runtime import START, Graph, NodeContext


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


def reshaped_graph(env: Env) -> Any:
    """v2's code: the approval graph with one more step (a different structure)."""

    def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"log": [f"asked:{ctx.interrupt('ok?')}"]}

    async def act(state: dict[str, Any]) -> dict[str, Any]:
        env.calls["act:v2"] = env.calls.get("act:v2", 0) + 1
        return {"log": ["act:v2"]}

    def audit(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": ["audit:v2"]}

    g = Graph(State, name="approve").node("ask", ask).node("act", act).node("audit", audit)
    return g.edge(START, "ask").edge("ask", "act").edge("act", "audit").compile()


@pytest.mark.asyncio
async def test_a_migrated_run_continues_on_the_new_code_at_once(env: Env) -> None:
    env.registry.add("approve", approval_graph(env, "v1"))
    old = env.worker("w-v1", version="v1")
    await submit(env.store, "t1", "approve", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "awaiting")
    await old.stop(grace=1)
    env.registry = Registry(default="echo")
    env.registry.add("approve", reshaped_graph(env))  # no policy: a changed graph would fail
    new = env.worker("w-v2", version="v2")  # the default pin grace (600 s) never passes here
    await new.started()
    (moved,) = await env.store.migrate_runs("v1", "v2")
    assert moved.dispatch_id == "d1" and moved.pinned_version == "v2"
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    ticket = snap.checkpoint.metadata["tickets"][0]["id"]
    answer = await resume(env.store, "t1", {ticket: "yes"}, dispatch_id="r1", wake=env.wake)
    assert answer.pinned_version == "v2", "the answer follows the moved run"
    await dispatch_status(env, "r1", "done")
    assert await env.status("t1") == "completed"
    assert env.calls.get("act:v2") == 1 and "act:v1" not in env.calls
    done = await env.store.read("t1")
    assert done is not None and done.checkpoint is not None
    assert done.checkpoint.state["log"] == ["asked:yes", "act:v2", "audit:v2"]
    events = await env.store.events_after("t1", 0, 100)
    types = [e.type for e in events]
    assert types.count("run.migrated") == 1
    assert "run.version_changed" not in types and "run.failed" not in types
    (migrated,) = [e for e in events if e.type == "run.migrated"]
    assert migrated.data["from"] == "v1" and migrated.data["to"] == "v2"
    assert migrated.run_id == snap.checkpoint.run_id


def test_runs_migrate_on_the_command_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"

    async def suspended_runs() -> None:
        async with open_store(url) as s:
            await s.register_worker("w-old", version="v1")
            await s.register_worker("w-new", version="v2")
            for n in range(3):
                await submit(s, f"t{n}", "approve", {}, dispatch_id=f"d{n}")
            for lease in await s.claim_next("w-old", 30, 3, version="v1"):
                tid, token = lease.dispatch.thread_id, lease.claim.token
                await s.commit(tid, Commit(token=token, events=(EventDraft(type="x"),)))
                await s.settle(lease.dispatch.dispatch_id, token, Awaiting())

    asyncio.run(suspended_runs())
    same = cli("runs", "migrate", "--from", "v1", "--to", "v1", store=url)
    assert same.returncode == 6 and "already pinned" in error_line(same)
    unknown = cli("runs", "migrate", "--from", "v1", "--to", "v9", store=url)
    assert unknown.returncode == 3 and "v9" in error_line(unknown)
    done = cli("runs", "migrate", "--from", "v1", "--to", "v2", "--json", store=url)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["from"], report["to"]) == ("v1", "v2")
    assert sorted(r["dispatch_id"] for r in report["moved"]) == ["d0", "d1", "d2"]
    again = cli("runs", "migrate", "--from", "v1", "--to", "v2", store=url)
    assert again.returncode == 3 and "no run of version v1" in error_line(again)

    async def check() -> None:
        async with open_store(url) as s:
            for n in range(3):
                d = await s.get_dispatch(f"d{n}")
                assert d is not None and d.pinned_version == "v2"
                events = await s.events_after(f"t{n}", 0, 10)
                assert [e.type for e in events] == ["x", "run.migrated"]

    asyncio.run(check())
