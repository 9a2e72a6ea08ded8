"""``if_busy="rollback"`` in the worker (issue 36): the busy run ends ``interrupted`` and the
thread's head, state and messages return to what they were before it started, as a new
branch (the run's commits stay readable); ``run.rolled_back`` lists its tool calls that
took effect; the new run starts on the restored state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.runtime_support import eventually
from tests.test_fleet_worker import Env, dispatch_status
from wakeful.agent import Agent, ToolContext, tool
from wakeful.fleet import submit
from wakeful.providers.scripted import Scripted, calls, reply

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


class Effects:
    """A payment system the agent's ``charge`` tool (``replay="never"``) writes to."""

    def __init__(self) -> None:
        self.charges: list[tuple[int, str]] = []
        self.hold = asyncio.Event()
        self.charge_waits = False

    def agent(self, model: Scripted) -> Agent:
        @tool(replay="never")
        async def charge(n: int, ctx: ToolContext) -> str:
            """Charge the customer."""
            self.charges.append((n, ctx.idempotency_key))
            if self.charge_waits:
                await self.hold.wait()
            return f"charged {n}"

        @tool
        async def look(n: int) -> str:
            """Look something up (slowly)."""
            await self.hold.wait()
            return "found"

        return Agent("shop", model, "Be brief.", [charge, look])


async def _events(env: Env, thread_id: str, type_: str) -> list[Any]:
    return [e for e in await env.store.events_after(thread_id, 0, 1000) if e.type == type_]


async def _has_event(env: Env, thread_id: str, type_: str) -> bool:
    return bool(await _events(env, thread_id, type_))


async def test_rollback_after_a_never_tool_ran_restores_the_thread_and_names_the_call(
    env: Env,
) -> None:
    effects = Effects()
    model = Scripted.of(
        reply("Hello."),  # d0
        calls(("c1", "charge", {"n": 5})),  # d1: the charge runs and is recorded
        calls(("c2", "look", {"n": 1})),  # d1: then a slow look-up, mid-call when rolled back
        reply("Nothing was charged."),  # d2
    )
    env.registry.add("shop", effects.agent(model))
    env.worker("w1")
    await submit(env.store, "t1", "shop", "hi", dispatch_id="d0", wake=env.wake)
    await dispatch_status(env, "d0", "done")
    before = await env.store.read("t1")
    assert before is not None and before.checkpoint is not None
    await submit(env.store, "t1", "shop", "charge me", dispatch_id="d1", wake=env.wake)
    await eventually(lambda: len(model.requests) == 3)  # the charge is committed
    assert [n for n, _ in effects.charges] == [5]
    second = await submit(
        env.store, "t1", "shop", "no, stop", dispatch_id="d2", wake=env.wake, if_busy="rollback"
    )
    assert (second.status, second.queued_behind) == ("queued", "d1")
    await dispatch_status(env, "d2", "done")
    effects.hold.set()  # the fenced look-up ends; its result is refused

    [event] = await _events(env, "t1", "run.rolled_back")
    assert event.run_id == "run-d1"
    assert event.data["interrupted_by"] == "d2" and event.data["interrupted_by_run"] == "run-d2"
    assert event.data["returned_to"] == before.checkpoint.id
    assert event.data["tool_calls"] == [
        {
            "tool": "charge",
            "call_id": "c1",
            "idempotency_key": effects.charges[0][1],
            "replay": "never",
            "outcome": "ok",
        }
    ]
    assert await _events(env, "t1", "run.interrupted") == []
    # the thread is back to its state before d1, on a new branch from d0's last checkpoint
    [branch] = await env.store.branches("t1")
    assert branch.fork_point == before.checkpoint.id and branch.messages == 2
    ended = (await env.store.get_checkpoint("t1", branch.checkpoint_id)).checkpoint  # type: ignore[union-attr]
    assert (ended.run_id, ended.status) == ("run-d1", "interrupted")
    assert ended.state == before.checkpoint.state
    assert ended.metadata["messages"] == 2
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert (snap.checkpoint.run_id, snap.checkpoint.status) == ("run-d2", "completed")
    assert [(m.role, m.content) for m in await env.store.messages("t1")] == [
        ("user", "hi"),
        ("assistant", "Hello."),
        ("user", "no, stop"),
        ("assistant", "Nothing was charged."),
    ]
    # d2's model turn saw the restored conversation, not the charge
    assert [m.content for m in model.requests[3].messages] == ["hi", "Hello.", "no, stop"]
    # nothing is destroyed: d1's messages are on the abandoned branch
    abandoned = await env.store.branch_messages("t1", 0, 0, 100)
    assert [m.content for m in abandoned] == ["hi", "Hello.", "charge me", "", "charged 5", ""]
    assert len(effects.charges) == 1, "the rollback does not run the tool again"


async def test_rollback_of_a_run_on_an_empty_thread_empties_it_and_names_a_started_call(
    env: Env,
) -> None:
    effects = Effects()
    effects.charge_waits = True  # the charge is mid-call: started, no outcome committed
    model = Scripted.of(calls(("c1", "charge", {"n": 7})), reply("Fresh start."))
    env.registry.add("shop", effects.agent(model))
    env.worker("w1")
    await submit(env.store, "t1", "shop", "charge me", dispatch_id="d1", wake=env.wake)
    await eventually(lambda: len(effects.charges) == 1)
    await submit(
        env.store, "t1", "shop", "start over", dispatch_id="d2", wake=env.wake,
        if_busy="rollback",
    )  # fmt: skip
    await dispatch_status(env, "d2", "done")
    effects.hold.set()

    [event] = await _events(env, "t1", "run.rolled_back")
    assert event.data["returned_to"] is None
    assert event.data["tool_calls"] == [
        {
            "tool": "charge",
            "call_id": "c1",
            "idempotency_key": effects.charges[0][1],
            "replay": "never",
            "outcome": "unknown",
        }
    ]
    [branch] = await env.store.branches("t1")
    assert branch.fork_point == "run-d1-c0" and branch.messages == 0
    ended = (await env.store.get_checkpoint("t1", branch.checkpoint_id)).checkpoint  # type: ignore[union-attr]
    assert ended.state == {} and ended.status == "interrupted"
    assert [(m.role, m.content) for m in await env.store.messages("t1")] == [
        ("user", "start over"),
        ("assistant", "Fresh start."),
    ]
    assert [m.content for m in model.requests[1].messages] == ["start over"]


async def test_rollback_of_a_replay_returns_to_the_head_it_branched_from(env: Env) -> None:
    """A run started ``from_checkpoint`` began with a branch: "before it started" is the
    head that branch left, not its fork point."""
    env.worker("w1")
    await submit(env.store, "t1", "echo", {"log": ["zero"]}, dispatch_id="d0", wake=env.wake)
    await dispatch_status(env, "d0", "done")
    before = await env.store.read("t1")
    assert before is not None and before.checkpoint is not None
    fork = next(
        cp.id for cp, _ in await env.store.checkpoints("t1") if cp.state == {"log": ["zero", "a"]}
    )
    env.gates["b"] = asyncio.Event()
    await submit(env.store, "t1", "echo", None, dispatch_id="d1", wake=env.wake,
                 from_checkpoint=fork)  # fmt: skip
    await eventually(lambda: env.calls.get("b") == 2)  # the replay waits in "b"
    await submit(env.store, "t1", "echo", {"log": ["two"]}, dispatch_id="d2", wake=env.wake,
                 if_busy="rollback")  # fmt: skip
    await eventually(lambda: _has_event(env, "t1", "run.rolled_back"))
    env.gates.pop("b").set()  # d2 runs "b" too
    await dispatch_status(env, "d2", "done")
    [event] = await _events(env, "t1", "run.rolled_back")
    assert event.data["returned_to"] == before.checkpoint.id
    branches = await env.store.branches("t1")
    assert [b.fork_point for b in branches] == [fork, before.checkpoint.id]
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.state == {"log": ["zero", "a", "b", "two", "a", "b"]}
