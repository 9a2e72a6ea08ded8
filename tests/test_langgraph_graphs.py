"""Graphs on ``WakefulSaver`` behave as on LangGraph's ``InMemorySaver``: interrupts
resumed with ``Command(resume=...)``, subgraphs (checkpoint namespaces), a failed node
resumed after the fix; values are stored as JSON and pickle is refused."""

from __future__ import annotations

import operator
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec
import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from wakeful import ManualClock, open_store
from wakeful.errors import InvalidInput, StaleClaim, ThreadBusy, VersionConflict
from wakeful.langgraph import WakefulSaver


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def approval_graph() -> StateGraph[Any]:
    def ask(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "ship it?"})
        return {"log": [f"answer:{answer}"]}

    def done(state: State) -> dict[str, Any]:
        return {"log": ["done"]}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_node("done", done)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "done")
    builder.add_edge("done", END)
    return builder


def nested_graph() -> StateGraph[Any]:
    def inner(state: State) -> dict[str, Any]:
        return {"log": ["inner"]}

    sub = StateGraph(State)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)

    def after(state: State) -> dict[str, Any]:
        return {"log": ["after"]}

    builder = StateGraph(State)
    builder.add_node("child", sub.compile())
    builder.add_node("after", after)
    builder.add_edge(START, "child")
    builder.add_edge("child", "after")
    builder.add_edge("after", END)
    return builder


def flaky_graph(broken: dict[str, bool], calls: list[str]) -> StateGraph[Any]:
    def steady(state: State) -> dict[str, Any]:
        calls.append("steady")
        return {"log": ["steady"]}

    def fragile(state: State) -> dict[str, Any]:
        calls.append("fragile")
        if broken["now"]:
            raise RuntimeError("fragile is broken")
        return {"log": ["fragile"]}

    builder = StateGraph(State)
    builder.add_node("steady", steady)
    builder.add_node("fragile", fragile)
    builder.add_edge(START, "steady")
    builder.add_edge(START, "fragile")
    builder.add_edge("steady", END)
    builder.add_edge("fragile", END)
    return builder


async def _scenarios(saver: BaseCheckpointSaver[Any]) -> dict[str, Any]:
    """What each scenario shows through LangGraph's public API on ``saver``."""
    seen: dict[str, Any] = {}
    graph = approval_graph().compile(checkpointer=saver)
    cfg: Any = {"configurable": {"thread_id": "approval"}}
    first = await graph.ainvoke({"log": []}, cfg)
    state = await graph.aget_state(cfg)
    seen["interrupted"] = (first["__interrupt__"][0].value, state.next)
    seen["resumed"] = await graph.ainvoke(Command(resume="yes"), cfg)
    seen["approval_history"] = len([s async for s in graph.aget_state_history(cfg)])

    nested = nested_graph().compile(checkpointer=saver)
    ncfg: Any = {"configurable": {"thread_id": "nested"}}
    seen["nested"] = await nested.ainvoke({"log": []}, ncfg)
    seen["nested_history"] = len([s async for s in nested.aget_state_history(ncfg)])

    broken: dict[str, bool] = {"now": True}
    calls: list[str] = []
    flaky = flaky_graph(broken, calls).compile(checkpointer=saver)
    fcfg: Any = {"configurable": {"thread_id": "flaky"}}
    with pytest.raises(RuntimeError, match="fragile is broken"):
        await flaky.ainvoke({"log": []}, fcfg)
    broken["now"] = False
    seen["fixed"] = await flaky.ainvoke(None, fcfg)
    seen["flaky_calls"] = sorted(calls)
    return seen


@pytest.mark.asyncio
@pytest.mark.parametrize("url", ["memory://", "sqlite"])
async def test_graphs_behave_as_with_in_memory_saver(url: str, tmp_path: Path) -> None:
    expected = await _scenarios(InMemorySaver())
    assert expected["flaky_calls"] == ["fragile", "fragile", "steady"], "the reference reuses"
    if url == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    async with WakefulSaver.from_url(url) as saver:
        assert await _scenarios(saver) == expected


@pytest.mark.asyncio
async def test_values_are_stored_as_json_and_pickle_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with WakefulSaver.from_url(url) as saver:
        graph = approval_graph().compile(checkpointer=saver)
        await graph.ainvoke({"log": []}, {"configurable": {"thread_id": "t"}})
        records = await saver.store.checkpoints("t", limit=1000)
        body = msgspec.json.encode([r.state for r, _ in records])
        assert b'"pickle"' not in body
        assert b'"values":{"log":{"j":[]}' in body, "plain JSON values are stored as JSON"

    pickling = JsonPlusSerializer(pickle_fallback=True)
    cfg: Any = {"configurable": {"thread_id": "p", "checkpoint_ns": ""}}
    async with WakefulSaver.from_url(url, serde=pickling) as saver:
        stored = await saver.aput(cfg, _checkpoint("c1"), {"source": "input", "step": -1}, {})
        with pytest.raises(InvalidInput, match="pickle"):
            await saver.aput_writes(stored, [("log", Opaque(3))], "task-1")
    async with WakefulSaver.from_url(url, serde=pickling, allow_pickle=True) as saver:
        await saver.aput_writes(stored, [("log", Opaque(3))], "task-1")
        tup = await saver.aget_tuple(stored)
        assert tup is not None and tup.pending_writes == [("task-1", "log", Opaque(3))]


def test_only_values_json_gives_back_unchanged_are_stored_as_json() -> None:
    from enum import StrEnum

    from wakeful.langgraph.codec import is_plain_json

    class Tag(StrEnum):
        A = "a"

    class Sub(dict[str, Any]):
        pass

    nested: Any = "leaf"
    for _ in range(70):
        nested = [nested]
    plain: list[Any] = ["s", 1, -(2**63), 2**64 - 1, 1.5, True, None, [], {}, {"a": [{"b": "c"}]}]
    refused: list[Any] = [
        (1, 2),
        {"a": (1,)},
        {1: "a"},
        {"a": {2: "b"}},
        ["a", Tag.A],
        {"k": Tag.A},
        Sub(a=1),
        [float("nan")],
        {"x": float("inf")},
        [2**64],
        -(2**63) - 1,
        b"bytes",
        {"a": ["s", {"b": {1, 2}}]},
        nested,
    ]
    assert [v for v in plain if not is_plain_json(v)] == []
    assert [v for v in refused if is_plain_json(v)] == []


class Opaque:
    """Only pickle can serialize it: LangGraph's msgpack has no form for a plain class
    (no dataclass, pydantic model or enum)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.n == self.n

    def __hash__(self) -> int:
        return self.n


def _checkpoint(checkpoint_id: str) -> Any:
    return {
        "v": 1,
        "id": checkpoint_id,
        "ts": "2025-01-01T00:00:00+00:00",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }


def test_sync_api_from_sync_code_and_from_a_thread(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with WakefulSaver.from_url_sync(url) as saver:
        graph = approval_graph().compile(checkpointer=saver)
        cfg: Any = {"configurable": {"thread_id": "sync"}}
        graph.invoke({"log": []}, cfg)
        results: list[Any] = []

        def resume() -> None:
            results.append(graph.invoke(Command(resume="later"), cfg))

        worker = threading.Thread(target=resume)
        worker.start()
        worker.join(timeout=60)
        assert results == [{"log": ["answer:later", "done"]}]
        assert len(list(saver.list(cfg))) == len(list(graph.get_state_history(cfg)))


@pytest.mark.asyncio
async def test_sync_call_on_the_saver_loop_is_refused_not_deadlocked() -> None:
    async with WakefulSaver.from_url("memory://") as saver:
        with pytest.raises(Exception, match="its own event loop"):
            saver.get_tuple({"configurable": {"thread_id": "x"}})


async def _put(saver: WakefulSaver, thread: str, cid: str, parent: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = parent
    return await saver.aput({"configurable": conf}, _checkpoint(cid), {"step": 0}, {})


@pytest.mark.asyncio
async def test_a_second_holder_gets_thread_busy_and_a_stale_one_writes_nothing() -> None:
    clock = ManualClock()
    store = await open_store("memory://", clock=clock)
    first = WakefulSaver(store, holder="first", ttl=5, renew_every=4)
    second = WakefulSaver(store, holder="second", ttl=5, renew_every=4)
    try:
        await _put(first, "t", "c1")
        with pytest.raises(ThreadBusy) as busy:
            await _put(second, "t", "c2")
        assert busy.value.holder == "first"
        clock.advance(6)  # first stalled past its claim: second takes over
        assert await second.aget_tuple({"configurable": {"thread_id": "t"}}) is not None
        await _put(second, "t", "c2", parent="c1")
        with pytest.raises(StaleClaim):
            await _put(first, "t", "c3", parent="c1")
        ids = [t.checkpoint["id"] async for t in second.alist({"configurable": {"thread_id": "t"}})]
        assert ids == ["c2", "c1"]
    finally:
        await first.aclose()
        await second.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_a_write_from_an_outdated_view_is_refused_without_fencing() -> None:
    store = await open_store("memory://")
    one = WakefulSaver(store, fencing="off", holder="one")
    two = WakefulSaver(store, fencing="off", holder="two")
    try:
        await _put(one, "t", "c1")
        assert await two.aget_tuple({"configurable": {"thread_id": "t"}}) is not None
        await _put(one, "t", "c2", parent="c1")
        with pytest.raises(VersionConflict):
            await _put(two, "t", "c3", parent="c1")
        assert await two.aget_tuple({"configurable": {"thread_id": "t"}}) is not None
        with pytest.raises(VersionConflict):  # the refused run stays refused
            await _put(two, "t", "c3", parent="c2")
        await two.release("t")
        await _put(two, "t", "c3", parent="c2")
        snap = await store.read("t")
        assert snap is not None and snap.claim is None, "off releases inside every write"
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_hold_mode_writes_only_inside_hold_and_releases_on_exit() -> None:
    store = await open_store("memory://")
    saver = WakefulSaver(store, fencing="hold", holder="held")
    other = WakefulSaver(store, holder="other")
    try:
        with pytest.raises(Exception, match="fencing='hold'"):
            await _put(saver, "t", "c1")
        async with saver.hold("t"):
            await _put(saver, "t", "c1")
            with pytest.raises(ThreadBusy):
                await _put(other, "t", "c2", parent="c1")
        await _put(other, "t", "c2", parent="c1")
    finally:
        await other.aclose()
        await store.close()
