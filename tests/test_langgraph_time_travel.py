"""LangGraph's time travel through ``WakefulSaver``, exactly as with its own savers: the
how-to flow (run a graph, ``get_state_history``, pick an earlier checkpoint,
``update_state`` on it -> a fork, ``invoke(None, config_with_checkpoint_id)`` replays from
it) gives what ``InMemorySaver`` gives (states, next nodes, history order, parent links), on
every store, each step from a saver that has nothing cached (another process's view), also
when the replay enters a subgraph; a branch is never made under a live run of the thread
(``ThreadBusy``), and a run fenced by a takeover stays fenced (decision 0042)."""

from __future__ import annotations

import asyncio
import operator
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, StateSnapshot, interrupt

from tests.langgraph_support import State, fan_out, url_for
from tests.postgres_support import Databases
from wakeful import ManualClock, open_store
from wakeful.errors import StaleClaim, ThreadBusy
from wakeful.langgraph import WakefulSaver

pytest_plugins = ["tests.postgres_fixtures"]

CONFIG: Any = {"configurable": {"thread_id": "travel"}}
LOOPS = 20
"""Enough supersteps that a thread outgrows what a saver's index keeps (32 checkpoints):
reads of older checkpoints and writes forking from them take the whole-history path."""


@pytest.fixture(
    params=["memory", "file", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    pg: Databases | None = None
    if request.param == "postgres":
        pg = request.getfixturevalue("pg_databases")
    return asyncio.run(url_for(request.param, tmp_path, pg))


class Travel(TypedDict):
    topic: str
    n: int
    log: Annotated[list[str], operator.add]


def travel_graph(calls: list[str]) -> StateGraph[Any]:
    """one -> loop (x LOOPS) -> ask (interrupts) -> two -> END; ``calls`` counts nodes."""

    def one(state: Travel) -> dict[str, Any]:
        calls.append("one")
        return {"log": [f"one:{state['topic']}"]}

    def loop(state: Travel) -> dict[str, Any]:
        calls.append("loop")
        return {"n": state["n"] + 1, "log": [f"loop{state['n']}"]}

    def ask(state: Travel) -> dict[str, Any]:
        calls.append("ask")
        return {"log": [f"ask:{interrupt('go on?')}:{state['topic']}"]}

    def two(state: Travel) -> dict[str, Any]:
        calls.append("two")
        return {"log": [f"two:{state['topic']}"]}

    builder = StateGraph(Travel)
    for name, node in (("one", one), ("loop", loop), ("ask", ask), ("two", two)):
        builder.add_node(name, node)
    builder.add_edge(START, "one")
    builder.add_edge("one", "loop")
    builder.add_conditional_edges("loop", lambda s: "loop" if s["n"] < LOOPS else "ask")
    builder.add_edge("ask", "two")
    builder.add_edge("two", END)
    return builder


def _result(values: dict[str, Any]) -> dict[str, Any]:
    """A run's result; an interrupt by its value (its id derives from checkpoint ids)."""
    if "__interrupt__" in values:
        values = {**values, "__interrupt__": [i.value for i in values["__interrupt__"]]}
    return values


def _history(snapshots: list[StateSnapshot]) -> list[tuple[Any, ...]]:
    """What a history shows, newest first: values, next nodes, step, source, the position
    of each checkpoint's parent in the list (ids differ between savers), pending tasks."""
    position = {s.config["configurable"]["checkpoint_id"]: i for i, s in enumerate(snapshots)}
    shown = []
    for s in snapshots:
        parent = s.parent_config["configurable"]["checkpoint_id"] if s.parent_config else None
        tasks = [(t.name, [i.value for i in t.interrupts]) for t in s.tasks]
        meta = s.metadata or {}
        shown.append(
            (s.values, s.next, meta.get("step"), meta.get("source"), position.get(parent), tasks)
        )
    return shown


Savers = Callable[[], AbstractAsyncContextManager[BaseCheckpointSaver[Any]]]


async def _how_to(savers: Savers) -> dict[str, Any]:
    """LangGraph's time-travel how-to, each step on a saver from ``savers()``."""
    seen: dict[str, Any] = {}
    calls: list[str] = []
    builder = travel_graph(calls)
    async with savers() as saver:
        graph = builder.compile(checkpointer=saver)
        seen["run"] = _result(await graph.ainvoke({"topic": "cats", "n": 0, "log": []}, CONFIG))
        seen["resumed"] = await graph.ainvoke(Command(resume="yes"), CONFIG)
    async with savers() as saver:
        graph = builder.compile(checkpointer=saver)
        history = [s async for s in graph.aget_state_history(CONFIG)]
        seen["history"] = _history(history)
        early = next(s for s in history if s.values.get("n") == 3)
    async with savers() as saver:  # edit an early checkpoint: a fork
        graph = builder.compile(checkpointer=saver)
        fork = await graph.aupdate_state(early.config, {"topic": "dogs"}, as_node="one")
        state = await graph.aget_state(fork)
        seen["fork"] = (state.values, state.next)
        head = await graph.aget_state(CONFIG)
        seen["head_is_fork"] = head.config == state.config
    async with savers() as saver:  # replay from the fork, then resume the new branch
        graph = builder.compile(checkpointer=saver)
        seen["replayed"] = _result(await graph.ainvoke(None, fork))
        seen["replay_resumed"] = await graph.ainvoke(Command(resume="again"), CONFIG)
        history = [s async for s in graph.aget_state_history(CONFIG)]
        seen["history_after_fork"] = _history(history)
        # replay an unchanged checkpoint of the first branch: its interrupt again
        before_ask = [s for s in history if s.next == ("ask",)][-1]
    async with savers() as saver:
        graph = builder.compile(checkpointer=saver)
        seen["replayed_unchanged"] = _result(await graph.ainvoke(None, before_ask.config))
        seen["resumed_third"] = await graph.ainvoke(Command(resume="third"), CONFIG)
        old = await graph.aget_state(before_ask.config)
        seen["old_state"] = (old.values, old.next)
        seen["history_at_end"] = _history([s async for s in graph.aget_state_history(CONFIG)])
        seen["recent"] = _history(
            [s async for s in graph.aget_state_history(CONFIG, before=fork, limit=3)]
        )
    seen["calls"] = {name: calls.count(name) for name in sorted(set(calls))}
    return seen


@pytest.mark.asyncio
async def test_the_time_travel_how_to_gives_what_in_memory_saver_gives(url: str) -> None:
    reference = InMemorySaver()

    @asynccontextmanager
    async def same_reference() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        yield reference

    expected = await _how_to(same_reference)
    assert expected["head_is_fork"] and expected["fork"][1] == ("loop",)
    assert expected["replay_resumed"]["log"][-2:] == ["ask:again:dogs", "two:dogs"]

    async with open_store(url) as store:

        @asynccontextmanager
        async def cold_saver() -> AsyncIterator[BaseCheckpointSaver[Any]]:
            saver = WakefulSaver(store)  # nothing cached: another process's view
            try:
                yield saver
            finally:
                await saver.aclose()

        seen = await _how_to(cold_saver)
    assert seen.keys() == expected.keys()
    for key, value in expected.items():
        assert seen[key] == value, key


@pytest.mark.asyncio
async def test_a_replay_or_an_edit_while_another_process_runs_the_thread_is_busy(
    url: str, tmp_path: Path
) -> None:
    async with open_store(url) as store:
        running = WakefulSaver(store, holder="running")
        other = WakefulSaver(store, holder="other")
        graph = fan_out(tmp_path / "calls").compile(checkpointer=running)
        await graph.ainvoke({"log": []}, CONFIG)
        first = [s async for s in graph.aget_state_history(CONFIG)][-2]
        before = await store.read("travel")
        replica = fan_out(tmp_path / "calls").compile(checkpointer=other)
        async with running.hold("travel"):  # a run of that process is live
            with pytest.raises(ThreadBusy) as busy:
                await replica.ainvoke(None, first.config)
            assert busy.value.holder == "running"
            with pytest.raises(ThreadBusy):
                await replica.aupdate_state(first.config, {"log": ["edit"]})
            after = await store.read("travel")
            assert before and after and after.version == before.version, "something was stored"
            assert sorted((tmp_path / "calls").read_text().split()) == ["a", "b", "c"]
        await running.aclose()
        fork = await replica.aupdate_state(first.config, {"log": ["edit"]})
        assert (await replica.aget_state(CONFIG)).config == (await replica.aget_state(fork)).config
        await other.aclose()


@pytest.mark.asyncio
async def test_an_edit_while_another_task_of_the_process_runs_the_thread_is_busy(
    url: str, tmp_path: Path
) -> None:
    inside, go_on = asyncio.Event(), asyncio.Event()

    async def in_b() -> None:
        inside.set()
        await go_on.wait()

    async with WakefulSaver.from_url(url) as saver:
        graph = fan_out(tmp_path / "calls", in_b).compile(checkpointer=saver)
        go_on.set()
        await graph.ainvoke({"log": ["A"]}, CONFIG)
        go_on.clear()
        first = [s async for s in graph.aget_state_history(CONFIG)][-2]
        running = asyncio.create_task(graph.ainvoke({"log": ["B"]}, CONFIG, durability="sync"))
        await asyncio.wait_for(inside.wait(), 10)
        with pytest.raises(ThreadBusy):  # a replay is a run: refused before any node
            await graph.ainvoke(None, first.config)
        with pytest.raises(ThreadBusy):  # an edit would branch the thread under the run
            await graph.aupdate_state(first.config, {"log": ["edit"]})
        go_on.set()
        final = await asyncio.wait_for(running, 10)
        assert final["log"] == ["A", "a", "b", "c", "B", "a", "b", "c"]
        sources = [(s.metadata or {}).get("source") async for s in graph.aget_state_history(CONFIG)]
        assert sources == ["loop", "loop", "loop", "input"] * 2, "the refused calls stored"
        assert sorted((tmp_path / "calls").read_text().split()) == ["a", "a", "b", "b", "c", "c"]
        # the run ended: the edit forks, and a replay from the fork runs on
        fork = await graph.aupdate_state(first.config, {"log": ["edit"]})
        assert (await graph.ainvoke(None, fork))["log"] == ["A", "edit", "a", "b", "c"]


def nested_graph() -> StateGraph[Any]:
    """a -> child (a subgraph: i1 -> i2) -> z."""
    sub = StateGraph(State)
    sub.add_node("i1", lambda state: {"log": ["i1"]})
    sub.add_node("i2", lambda state: {"log": ["i2"]})
    sub.add_edge(START, "i1")
    sub.add_edge("i1", "i2")
    sub.add_edge("i2", END)
    builder = StateGraph(State)
    builder.add_node("a", lambda state: {"log": ["a"]})
    builder.add_node("child", sub.compile())
    builder.add_node("z", lambda state: {"log": ["z"]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "child")
    builder.add_edge("child", "z")
    builder.add_edge("z", END)
    return builder


async def _subgraph_replays(saver: BaseCheckpointSaver[Any]) -> dict[str, Any]:
    """Replay and edit a checkpoint whose next node is a subgraph: LangGraph's replay has
    the subgraph read its namespace with ``list`` (``before`` the replayed checkpoint)."""
    graph = nested_graph().compile(checkpointer=saver)
    seen: dict[str, Any] = {"run": await graph.ainvoke({"log": []}, CONFIG)}
    history = [s async for s in graph.aget_state_history(CONFIG)]
    before_child = next(s for s in history if s.next == ("child",))
    seen["replayed"] = await graph.ainvoke(None, before_child.config)
    fork = await graph.aupdate_state(before_child.config, {"log": ["edit"]})
    seen["edited"] = await graph.ainvoke(None, fork)
    seen["history"] = _history([s async for s in graph.aget_state_history(CONFIG)])
    return seen


@pytest.mark.asyncio
async def test_replaying_into_a_subgraph_gives_what_in_memory_saver_gives(url: str) -> None:
    expected = await _subgraph_replays(InMemorySaver())
    # (the subgraph returns the whole shared state, which the parent's reducer appends)
    assert expected["edited"] == {"log": ["a", "edit", "a", "edit", "i1", "i2", "z"]}
    async with WakefulSaver.from_url(url) as saver:
        assert await _subgraph_replays(saver) == expected


@pytest.mark.asyncio
async def test_an_edit_by_the_task_whose_run_ended_is_not_refused_without_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If a LangGraph version hides its loop, a run ends only by the other rules (its owner
    ends, idles, or starts another run): the task that ran it may still edit its thread,
    and a synchronous caller's thread likewise."""
    monkeypatch.setattr("wakeful.langgraph.saver.pregel_loop", lambda depth: None)
    monkeypatch.setattr("wakeful.langgraph.sync.pregel_loop", lambda depth: None)
    async with WakefulSaver.from_url("memory://") as saver:
        graph = fan_out(tmp_path / "calls").compile(checkpointer=saver)
        await graph.ainvoke({"log": []}, CONFIG)
        first = [s async for s in graph.aget_state_history(CONFIG)][-2]
        fork = await graph.aupdate_state(first.config, {"log": ["edit"]})
        assert (await graph.aget_state(CONFIG)).config == (await graph.aget_state(fork)).config
    with WakefulSaver.from_url_sync(f"sqlite:///{tmp_path / 'store.db'}") as saver:
        graph = nested_graph().compile(checkpointer=saver)
        graph.invoke({"log": []}, CONFIG)
        first = list(graph.get_state_history(CONFIG))[-2]
        fork = graph.update_state(first.config, {"log": ["edit"]})
        assert graph.get_state(CONFIG).config == graph.get_state(fork).config


def test_a_synchronous_edit_while_another_thread_runs_the_thread_is_busy(tmp_path: Path) -> None:
    inside, go_on = threading.Event(), threading.Event()

    def blocking(state: State) -> dict[str, Any]:
        inside.set()
        assert go_on.wait(10)
        return {"log": ["x"]}

    builder = StateGraph(State)
    builder.add_node("x", blocking)
    builder.add_edge(START, "x")
    builder.add_edge("x", END)
    with WakefulSaver.from_url_sync(f"sqlite:///{tmp_path / 'store.db'}") as saver:
        graph = builder.compile(checkpointer=saver)
        results: list[Any] = []

        def run() -> None:
            results.append(graph.invoke({"log": []}, CONFIG, durability="sync"))

        worker = threading.Thread(target=run)
        worker.start()
        assert inside.wait(10)  # the checkpoints before ``x`` are stored (``sync``)
        start = list(graph.get_state_history(CONFIG))[-1]
        with pytest.raises(ThreadBusy):
            graph.update_state(start.config, {"log": ["edit"]})
        go_on.set()
        worker.join(10)
        assert results == [{"log": ["x"]}]
        sources = [(s.metadata or {}).get("source") for s in graph.get_state_history(CONFIG)]
        assert sources == ["loop", "loop", "input"], "the refused edit stored something"
        fork = graph.update_state(start.config, {"log": ["edit"]})  # the run ended
        assert graph.get_state(CONFIG).config == graph.get_state(fork).config


class FenceProbe(WakefulSaver):
    """Sets ``fenced`` when one of its writes is refused as stale."""

    fenced: asyncio.Event

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        try:
            await super().aput_writes(config, writes, task_id, task_path)
        except StaleClaim:
            self.fenced.set()
            raise


@pytest.mark.asyncio
@pytest.mark.parametrize("replay", [False, True])
async def test_a_taken_over_run_stays_fenced_when_a_subgraph_starts_after(replay: bool) -> None:
    """``a`` stalls past the lease and another process takes the thread over (and lets it
    go); ``a``'s write is refused. The subgraph in ``child``, started after that, must not
    claim the thread again for the fenced run: nothing lands after the takeover. With
    ``replay`` the run replays the thread's first checkpoint (the subgraph's first read is
    then a ``list``)."""
    clock = ManualClock()
    stall = {"now": not replay}
    after_takeover: list[int] = []
    async with open_store("memory://", clock=clock) as store:
        first = FenceProbe(store, holder="first", ttl=5, renew_every=4)
        first.fenced = asyncio.Event()
        second = WakefulSaver(store, holder="second")
        sub = nested_graph().compile()

        async def a(state: State) -> dict[str, Any]:
            if stall["now"]:
                clock.advance(6)  # ``first`` stalled past its lease
                async with second.hold("travel"):  # taken over, then let go
                    pass
                snap = await store.read("travel")
                after_takeover.append(snap.version if snap else 0)
            return {"log": ["a"]}

        async def child(state: State) -> dict[str, Any]:
            if stall["now"]:
                await asyncio.wait_for(first.fenced.wait(), 10)
            return {"log": (await sub.ainvoke({"log": []}))["log"]}

        builder = StateGraph(State)
        builder.add_node("a", a)
        builder.add_node("child", child)
        builder.add_edge(START, "a")
        builder.add_edge(START, "child")
        builder.add_edge("a", END)
        builder.add_edge("child", END)
        graph = builder.compile(checkpointer=first)
        config = CONFIG
        if replay:
            await graph.ainvoke({"log": []}, CONFIG)
            config = [s async for s in graph.aget_state_history(CONFIG)][-1].config
            stall["now"] = True
        with pytest.raises(StaleClaim):
            await graph.ainvoke(None if replay else {"log": []}, config)
        snap = await store.read("travel")
        assert snap is not None and [snap.version] == after_takeover, "the fenced run wrote"
        await second.aclose()
