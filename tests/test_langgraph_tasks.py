"""``WakefulSaver`` fences tasks as well as processes: a second concurrent run of a thread
within one process gets ``ThreadBusy`` before any node runs and stores nothing; a run that
was displaced (its owner idled past ``idle_release``) is refused at its next write; runs one
after the other, from one task or from several, go on as before."""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph

from tests.langgraph_support import State, fan_out, url_for
from tests.postgres_support import Databases
from wakeful.errors import StaleClaim, ThreadBusy
from wakeful.langgraph import WakefulSaver

pytest_plugins = ["tests.postgres_fixtures"]

CONFIG: Any = {"configurable": {"thread_id": "t"}}


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    pg: Databases | None = None
    if request.param == "postgres":
        pg = request.getfixturevalue("pg_databases")
    return asyncio.run(url_for(request.param, tmp_path, pg))


async def _chain(saver: WakefulSaver) -> list[dict[str, Any]]:
    """The thread's checkpoints, newest first, asserting they form one chain."""
    listed = [t async for t in saver.alist(CONFIG)]
    for newer, older in itertools.pairwise(listed):
        assert newer.parent_config is not None
        assert (
            newer.parent_config["configurable"]["checkpoint_id"]
            == older.config["configurable"]["checkpoint_id"]
        ), "two runs' checkpoints interleaved"
    assert listed[-1].parent_config is None
    return [t.checkpoint["channel_values"] for t in listed]


@pytest.mark.asyncio
async def test_gathered_runs_on_one_thread_one_succeeds_the_other_is_busy(
    url: str, tmp_path: Path
) -> None:
    async with WakefulSaver.from_url(url) as saver:
        graph = fan_out(tmp_path / "calls").compile(checkpointer=saver)
        results = await asyncio.gather(
            graph.ainvoke({"log": ["A"]}, CONFIG, durability="sync"),
            graph.ainvoke({"log": ["B"]}, CONFIG, durability="sync"),
            return_exceptions=True,
        )
        assert isinstance(results[1], ThreadBusy), results
        assert results[0] == {"log": ["A", "a", "b", "c"]}
        values = await _chain(saver)
        assert not any("B" in v.get("log", []) for v in values)
        # the nodes ran once, for A only
        assert sorted((tmp_path / "calls").read_text().split()) == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_a_run_started_while_another_task_runs_the_thread_is_refused_before_any_node(
    url: str, tmp_path: Path
) -> None:
    inside, go_on = asyncio.Event(), asyncio.Event()

    async def in_b() -> None:
        inside.set()
        await go_on.wait()

    calls = tmp_path / "calls"
    async with WakefulSaver.from_url(url) as saver:
        graph = fan_out(calls, in_b).compile(checkpointer=saver)
        first = asyncio.create_task(graph.ainvoke({"log": ["A"]}, CONFIG, durability="sync"))
        await asyncio.wait_for(inside.wait(), 10)
        stored = len([t async for t in saver.alist(CONFIG)])
        with pytest.raises(ThreadBusy) as busy:  # (not a run waiting in ``b`` too)
            await asyncio.wait_for(graph.ainvoke({"log": ["B"]}, CONFIG), 10)
        assert busy.value.holder == saver.holder
        assert len([t async for t in saver.alist(CONFIG)]) == stored, "B stored something"
        go_on.set()
        assert await asyncio.wait_for(first, 10) == {"log": ["A", "a", "b", "c"]}
        assert sorted(calls.read_text().split()) == ["a", "b", "c"]
        # once the first run's task ended, another task runs the thread on
        later = asyncio.create_task(graph.ainvoke({"log": ["C"]}, CONFIG, durability="sync"))
        assert (await later)["log"] == ["A", "a", "b", "c", "C", "a", "b", "c"]
        # and the same task runs it again after its own run
        assert (await graph.ainvoke({"log": ["D"]}, CONFIG))["log"][-4:] == ["D", "a", "b", "c"]
        assert len(await _chain(saver)) == 12  # 4 checkpoints a run


@pytest.mark.asyncio
async def test_a_run_displaced_after_idling_past_idle_release_writes_nothing_more(
    url: str, tmp_path: Path
) -> None:
    inside, go_on = asyncio.Event(), asyncio.Event()

    async def in_b() -> None:
        inside.set()
        await go_on.wait()

    async with WakefulSaver.from_url(url, idle_release=0.0) as saver:
        graph = fan_out(tmp_path / "calls", in_b).compile(checkpointer=saver)
        first = asyncio.create_task(graph.ainvoke({"log": ["A"]}, CONFIG, durability="sync"))
        await asyncio.wait_for(inside.wait(), 10)
        inside.clear()
        # A idled past idle_release (0 s): B may take the thread over, A is displaced
        second = asyncio.create_task(graph.ainvoke({"log": ["B"]}, CONFIG, durability="sync"))
        await asyncio.wait_for(inside.wait(), 10)
        go_on.set()
        with pytest.raises(StaleClaim):
            await asyncio.wait_for(first, 10)
        assert (await second)["log"][-4:] == ["B", "a", "b", "c"]
        values = await _chain(saver)
        assert values[0]["log"].count("c") == 1, "A's later steps landed after B's"


def test_synchronous_runs_from_two_threads_are_fenced(tmp_path: Path) -> None:
    inside, go_on = threading.Event(), threading.Event()

    def blocking(state: Any) -> dict[str, Any]:
        inside.set()
        assert go_on.wait(5)
        return {"log": ["x"]}

    builder = StateGraph(State)
    builder.add_node("x", blocking)
    builder.add_edge(START, "x")
    builder.add_edge("x", END)
    with WakefulSaver.from_url_sync(f"sqlite:///{tmp_path / 'store.db'}") as saver:
        graph = builder.compile(checkpointer=saver)
        results: list[Any] = []
        worker = threading.Thread(target=lambda: results.append(graph.invoke({"log": []}, CONFIG)))
        worker.start()
        assert inside.wait(10)
        with pytest.raises(ThreadBusy):
            graph.invoke({"log": ["B"]}, CONFIG)
        go_on.set()
        worker.join(10)
        assert results == [{"log": ["x"]}]
        assert graph.invoke({"log": ["C"]}, CONFIG) == {"log": ["x", "C", "x"]}


@pytest.mark.asyncio
async def test_a_run_that_ended_in_a_task_that_lives_on_leaves_the_thread_to_other_tasks(
    tmp_path: Path,
) -> None:
    ran, done = asyncio.Event(), asyncio.Event()
    async with WakefulSaver.from_url("memory://") as saver:
        graph = fan_out(tmp_path / "calls").compile(checkpointer=saver)

        async def worker() -> None:  # a long-lived task: runs the thread, then goes on living
            await graph.ainvoke({"log": ["A"]}, CONFIG)
            ran.set()
            await done.wait()

        lives_on = asyncio.create_task(worker())
        await asyncio.wait_for(ran.wait(), 10)
        other = asyncio.create_task(graph.ainvoke({"log": ["B"]}, CONFIG))
        assert (await other)["log"][-4:] == ["B", "a", "b", "c"]
        assert not lives_on.done()
        done.set()
        await lives_on
