"""Busy threads in the worker (issue 36) over one store in one process: an interrupted run
ends ``interrupted`` and the interrupting run starts on what it committed; a suspended run
interrupted has its tickets superseded; coalesced submissions are answered by one run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.runtime_support import eventually
from tests.test_fleet_worker import Env, State, dispatch_status
from wakeful.errors import ThreadBusy
from wakeful.fleet import submit
from wakeful.records import StreamCheckpoint
from wakeful.runtime import START, Graph, NodeContext

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


async def _events(env: Env, thread_id: str, type_: str) -> list[Any]:
    return [e for e in await env.store.events_after(thread_id, 0, 1000) if e.type == type_]


async def _has_event(env: Env, thread_id: str, type_: str) -> bool:
    return bool(await _events(env, thread_id, type_))


async def test_interrupt_ends_the_busy_run_and_the_new_run_starts_on_its_commits(
    env: Env,
) -> None:
    env.gates["b"] = asyncio.Event()
    worker = env.worker("w1")
    await submit(env.store, "t1", "echo", {"log": ["one"]}, dispatch_id="d1", wake=env.wake)
    await eventually(lambda: env.calls.get("b") == 1)  # d1 committed "a", waits in "b"
    snap = await env.store.read("t1")
    assert snap is not None and snap.claim is not None
    # the run's model turn as far as it streamed (what the agent stores, best effort)
    await env.store.stream_checkpoints.put(
        StreamCheckpoint(
            run_id="run-d1", thread_id="t1", model="m", partial_text="Hel", token=snap.claim.token
        )
    )
    second = await submit(
        env.store, "t1", "echo", {"log": ["two"]}, dispatch_id="d2", wake=env.wake,
        if_busy="interrupt",
    )  # fmt: skip
    assert (second.status, second.queued_behind) == ("queued", "d1")
    await eventually(lambda: _has_event(env, "t1", "run.interrupted"))
    env.gates.pop("b").set()  # the fenced owner of d1 finds out at its next write
    await dispatch_status(env, "d2", "done")
    await eventually(lambda: worker.stats.fenced == 1)

    history = [cp for cp, _ in await env.store.checkpoints("t1", limit=100)]
    ended = next(cp for cp in history if cp.run_id == "run-d1" and cp.status != "running")
    assert ended.status == "interrupted" and ended.state == {"log": ["one", "a"]}
    [event] = await _events(env, "t1", "run.interrupted")
    assert event.run_id == "run-d1"
    assert event.data["interrupted_by"] == "d2" and event.data["interrupted_by_run"] == "run-d2"
    partial = [m for m in await env.store.messages("t1") if m.metadata.get("interrupted")]
    assert [(m.role, m.content, m.run_id) for m in partial] == [("assistant", "Hel", "run-d1")]
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.run_id == "run-d2" and snap.checkpoint.status == "completed"
    assert snap.checkpoint.state == {"log": ["one", "a", "two", "a", "b"]}
    assert await _events(env, "t1", "run.cancelled") == []
    assert [e.run_id for e in await _events(env, "t1", "run.completed")] == ["run-d2"]


async def test_interrupting_a_suspended_run_supersedes_its_tickets(env: Env) -> None:
    def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"log": [f"answer={ctx.interrupt('ok?')}"]}

    env.registry.add(
        "asker", Graph(State, name="asker").node("ask", ask).edge(START, "ask").compile()
    )
    env.worker("w1")
    await submit(env.store, "t1", "asker", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "awaiting")
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    [ticket] = snap.checkpoint.metadata["tickets"]
    with pytest.raises(ThreadBusy) as refused:  # a suspended run keeps the thread busy
        await submit(env.store, "t1", "echo", {}, dispatch_id="d-r", if_busy="reject")
    assert refused.value.dispatch_id == "d1"
    await submit(
        env.store, "t1", "echo", {"log": ["next"]}, dispatch_id="d2", wake=env.wake,
        if_busy="interrupt",
    )  # fmt: skip
    await dispatch_status(env, "d2", "done")
    history = [cp for cp, _ in await env.store.checkpoints("t1", limit=100)]
    ended = next(cp for cp in history if cp.run_id == "run-d1" and cp.status != "suspended")
    assert ended.status == "interrupted"
    assert ended.metadata["tickets"] == [] and ended.metadata["superseded_tickets"] == [
        ticket["id"]
    ]
    [event] = await _events(env, "t1", "run.interrupted")
    assert event.data["superseded_tickets"] == [ticket["id"]]
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.state == {"log": ["next", "a", "b"]}


async def test_coalesced_submissions_are_answered_by_one_run(env: Env) -> None:
    env.gates["b"] = asyncio.Event()
    env.worker("w1")
    await submit(env.store, "t1", "echo", {"log": ["zero"]}, dispatch_id="d0", wake=env.wake)
    await eventually(lambda: env.calls.get("b") == 1)
    for i in (1, 2, 3):
        queued = await submit(
            env.store, "t1", "echo", {"log": [f"m{i}"]}, dispatch_id=f"c{i}", wake=env.wake,
            if_busy="coalesce",
        )  # fmt: skip
        assert queued.status == "queued"
    env.gates["b"].set()
    await dispatch_status(env, "c1", "done")
    for name in ("c2", "c3"):
        d = await env.dispatch(name)
        assert d.status == "done" and d.answered_by == "c1"
    assert (await env.dispatch("c1")).coalesced == ("c2", "c3")
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.run_id == "run-c1"
    assert snap.checkpoint.state == {"log": ["zero", "a", "b", "m1", "m2", "m3", "a", "b"]}
    assert env.calls == {"a": 2, "b": 2}, "three submissions, one run"
    assert [e.run_id for e in await _events(env, "t1", "run.completed")] == ["run-d0", "run-c1"]
