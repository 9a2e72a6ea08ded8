"""Graph definition, validation, reducers, routing, fan-out and the step limit."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest

from wakeful import ManualClock
from wakeful.errors import GraphInvalid, RunFailed
from wakeful.runtime import END, START, Graph, NodeContext, Runtime, Send, append
from wakeful.store.memory import MemoryStore


class State(TypedDict):
    log: Annotated[list[str], append]
    total: Annotated[int, lambda old, new: (old or 0) + new]
    last: str


def writer(tag: str) -> Any:
    def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": [tag], "total": 1, "last": tag}

    return node


async def run(graph: Any, input: dict[str, Any] | None = None) -> dict[str, Any]:
    store = MemoryStore(ManualClock())
    handle = await Runtime(store).start("t", graph, input or {})
    outcome = await handle.result()
    assert outcome.status == "completed"
    return dict(outcome.state)


def test_compile_rejects_unknown_unreachable_and_entryless_graphs() -> None:
    with pytest.raises(GraphInvalid, match="unknown node 'nope'"):
        Graph(State).node("a", writer("a")).edge(START, "a").edge("a", "nope").compile()
    with pytest.raises(GraphInvalid, match="'b' is unreachable"):
        Graph(State).node("a", writer("a")).node("b", writer("b")).edge(START, "a").compile()
    with pytest.raises(GraphInvalid, match="no entry"):
        Graph(State).node("a", writer("a")).compile()
    with pytest.raises(GraphInvalid, match="defined twice"):
        Graph(State).node("a", writer("a")).node("a", writer("a"))
    with pytest.raises(GraphInvalid, match="conditional edge to unknown node"):
        Graph(State).node("a", writer("a")).edge(START, "a").conditional_edge(
            "a", lambda s: END, ["ghost"]
        ).compile()


def test_fingerprint_is_structural() -> None:
    def build(extra_edge: bool) -> str:
        g = Graph(State).node("a", writer("a")).node("b", writer("other")).edge(START, "a")
        g.edge("a", "b")
        if extra_edge:
            g.edge("b", END)
        return g.compile().fingerprint

    assert build(False) == build(False)
    assert build(False) != build(True)


@pytest.mark.asyncio
async def test_reducers_replace_append_and_custom() -> None:
    g = (
        Graph(State)
        .node("a", writer("a"))
        .node("b", writer("b"))
        .edge(START, "a")
        .edge("a", "b")
        .edge("b", END)
        .compile()
    )
    state = await run(g, {"log": ["in"], "total": 10})
    assert state == {"log": ["in", "a", "b"], "total": 12, "last": "b"}


@pytest.mark.asyncio
async def test_parallel_writes_apply_in_frontier_order_not_completion_order() -> None:
    import asyncio

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.02)
        return {"log": ["slow"], "last": "slow"}

    def fast(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": ["fast"], "last": "fast"}

    g = (
        Graph(State)
        .node("slow", slow)
        .node("fast", fast)
        .edge(START, "slow")
        .edge(START, "fast")
        .compile()
    )
    state = await run(g)
    assert state["log"] == ["slow", "fast"] and state["last"] == "fast"


@pytest.mark.asyncio
async def test_conditional_routing_and_loops() -> None:
    def count(state: dict[str, Any]) -> dict[str, Any]:
        return {"total": 1}

    g = (
        Graph(State)
        .node("count", count)
        .edge(START, "count")
        .conditional_edge("count", lambda s: "count" if s["total"] < 5 else END, ["count"])
        .compile()
    )
    assert (await run(g))["total"] == 5


@pytest.mark.asyncio
async def test_fan_out_with_send_and_join() -> None:
    def plan(state: dict[str, Any]) -> dict[str, Any]:
        return {"last": "planned"}

    def work(arg: Any, ctx: NodeContext) -> dict[str, Any]:
        return {"log": [f"{arg['item']}@{ctx.task_id}"], "total": arg["item"]}

    g = (
        Graph(State)
        .node("plan", plan)
        .node("work", work)
        .node("join", writer("join"))
        .edge(START, "plan")
        .conditional_edge("plan", lambda s: [Send("work", {"item": i}) for i in (1, 2, 3)])
        .edge("work", "join")
        .edge("join", END)
        .compile()
    )
    state = await run(g)
    assert state["log"][:3] == ["1@s1-t0", "2@s1-t1", "3@s1-t2"]
    assert state["log"][3:] == ["join"], "join is triggered once by its three predecessors"
    assert state["total"] == 7


@pytest.mark.asyncio
async def test_step_limit_fails_the_run_and_records_it() -> None:
    g = (
        Graph(State)
        .node("spin", writer("x"))
        .edge(START, "spin")
        .edge("spin", "spin")
        .compile(max_steps=5)
    )
    store = MemoryStore(ManualClock())
    handle = await Runtime(store).start("t", g, {})
    with pytest.raises(RunFailed, match="step limit of 5"):
        await handle.result()
    snap = await store.read("t")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "failed" and snap.claim is None
    assert "step limit" in snap.checkpoint.metadata["error"]
    assert handle.status == "failed"


@pytest.mark.asyncio
async def test_updates_to_unknown_fields_and_non_json_fail_the_run() -> None:
    for bad in ({"nope": 1}, {"last": object()}):
        g = Graph(State).node("a", lambda s, b=bad: b).edge(START, "a").compile()
        store = MemoryStore(ManualClock())
        handle = await Runtime(store).start("t", g, {})
        with pytest.raises(RunFailed):
            await handle.result()
        snap = await store.read("t")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.status == "failed"
