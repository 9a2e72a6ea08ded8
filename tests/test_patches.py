"""Patches (issue 40): ``ctx.patched`` answers from the code a run started on, whatever code
continues it (a resume after a deploy, a recovery)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

import pytest

from wakeful import ManualClock
from wakeful.agent import Agent, ToolContext, tool
from wakeful.errors import GraphInvalid, InvalidInput
from wakeful.providers.scripted import Scripted, calls, reply
from wakeful.runtime import START, Graph, NodeContext, Runtime, append
from wakeful.store.memory import MemoryStore


class State(TypedDict):
    log: Annotated[list[str], append]


def deploy(patches: list[str], gate: asyncio.Event | None = None) -> Any:
    """One graph, two deploys: ``ask`` suspends for approval, ``act`` branches on the patch."""

    def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        ctx.interrupt("approve?")
        return {"log": ["asked"]}

    async def act(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        branch = "new" if ctx.patched("refund-v2") else "old"
        if gate is not None:
            await gate.wait()
        return {"log": [branch]}

    g = Graph(State, patches=patches).node("ask", ask).node("act", act)
    return g.edge(START, "ask").edge("ask", "act").compile()


@pytest.mark.asyncio
async def test_a_run_keeps_the_patch_decision_of_the_code_it_started_on() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    old, new = deploy([]), deploy(["refund-v2"])
    assert old.fingerprint == new.fingerprint, "a patch does not change the graph's shape"
    runtime = Runtime(store)
    suspended = await (await runtime.start("before", old, {})).result()
    assert suspended.status == "suspended"
    ticket = suspended.tickets[0].id
    # the deploy: the run suspended on the old code is resumed by the new code
    resumed = await (await runtime.resume("before", new, {ticket: True})).result()
    assert resumed.state["log"] == ["asked", "old"]
    await (await runtime.start("after", new, {})).result()
    snap = await store.read("after")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.metadata["patches"] == ["refund-v2"]
    ticket = snap.checkpoint.metadata["tickets"][0]["id"]
    fresh = await (await runtime.resume("after", new, {ticket: True})).result()
    assert fresh.state["log"] == ["asked", "new"]
    events = [e for e in await store.events_after("after", 0, 100) if e.type == "run.started"]
    assert events[0].data["patches"] == ["refund-v2"]


@pytest.mark.asyncio
@pytest.mark.parametrize("started_on", ["old", "new"])
async def test_a_recovery_repeats_the_recorded_decision(started_on: str) -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    gate = asyncio.Event()
    first = deploy([] if started_on == "old" else ["refund-v2"], gate)
    suspended = await (await Runtime(store, holder="a").start("t", first, {})).result()
    # the first attempt of ``act`` hangs on the gate: the worker is gone, its claim lapses
    abandoned = await Runtime(store, holder="a").resume("t", first, {suspended.tickets[0].id: 1})
    clock.advance(31)
    # recovered on the other code: the newer deploy for an old run, a rollback for a new one
    other = deploy(["refund-v2"] if started_on == "old" else [])
    handle = await Runtime(store, holder="b").recover("t", other)
    gate.set()
    recovered = await handle.result()
    assert recovered.state["log"] == ["asked", started_on]
    await abandoned.cancel()


def test_patch_ids_are_checked() -> None:
    with pytest.raises(InvalidInput):
        Graph(State, patches=["no spaces allowed"])
    with pytest.raises(GraphInvalid):
        Graph(State, patches=["a", "a"])


@pytest.mark.asyncio
@pytest.mark.parametrize("patches", [[], ["refund-in-cents"]])
async def test_a_tool_asks_the_patches_of_its_agents_run(patches: list[str]) -> None:
    seen: list[bool] = []

    @tool
    def refund(order_id: int, ctx: ToolContext) -> str:
        """Refund an order."""
        seen.append(ctx.patched("refund-in-cents"))
        return "refunded"

    provider = Scripted.of(calls(("c1", "refund", {"order_id": 42})), reply("Done."))
    store = MemoryStore(ManualClock())
    agent = Agent("support", provider, tools=[refund], patches=patches)
    result = await agent.run(Runtime(store), "t", "refund 42")
    assert result.text == "Done." and seen == [bool(patches)]
