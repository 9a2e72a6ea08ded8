"""A 3-node linear graph with durability ``sync``: runs per second on the memory, file and
SQLite stores, beside LangGraph's ``InMemorySaver`` and ``SqliteSaver`` on the same graph in
the same run (``pip install 'wakeful[bench]'``).

Each run starts a fresh thread: claim, admission commit, three tasks each committed as a
pending write, three checkpoints, release."""

from __future__ import annotations

import asyncio
import operator
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from wakeful import open_store
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime, append

RUNS = 300


class State(TypedDict):
    log: Annotated[list[str], append]


def node(tag: str) -> Any:
    def fn(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": [tag]}

    return fn


async def async_node_factory(tag: str) -> Any:
    async def fn(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": [tag]}

    return fn


async def wakeful_rate(url: str, runs: int) -> float:
    nodes = {n: await async_node_factory(n) for n in ("a", "b", "c")}
    g = Graph(State)
    for name, fn in nodes.items():
        g.node(name, fn)
    graph = g.edge(START, "a").edge("a", "b").edge("b", "c").compile()
    async with open_store(url) as store:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10))
        start = time.perf_counter()
        for i in range(runs):
            handle = await runtime.start(f"t{i}", graph, {"log": []}, durability="sync")
            await handle.result()
        return runs / (time.perf_counter() - start)


def langgraph_rate(saver: Any, runs: int) -> float:
    from langgraph.graph import END, StateGraph
    from langgraph.graph import START as LG_START

    class LGState(TypedDict):
        log: Annotated[list[str], operator.add]

    builder = StateGraph(LGState)
    for name in ("a", "b", "c"):
        builder.add_node(name, node(name))
    builder.add_edge(LG_START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    graph = builder.compile(checkpointer=saver)
    start = time.perf_counter()
    for i in range(runs):
        graph.invoke({"log": []}, {"configurable": {"thread_id": f"t{i}"}}, durability="sync")
    return runs / (time.perf_counter() - start)


def main() -> None:
    rows: list[tuple[str, float | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows.append(("wakeful memory", asyncio.run(wakeful_rate("memory://", RUNS))))
        rows.append(("wakeful file", asyncio.run(wakeful_rate(f"file://{root / 'fs'}", RUNS))))
        rows.append(
            ("wakeful sqlite", asyncio.run(wakeful_rate(f"sqlite:///{root / 'w.db'}", RUNS)))
        )
        try:
            from langgraph.checkpoint.memory import InMemorySaver
            from langgraph.checkpoint.sqlite import SqliteSaver
        except ImportError as exc:
            print(f"LangGraph columns skipped ({exc}); pip install 'wakeful[bench]'")
        else:
            rows.append(("langgraph InMemorySaver", langgraph_rate(InMemorySaver(), RUNS)))
            conn = sqlite3.connect(root / "lg.db", check_same_thread=False)
            try:
                saver = SqliteSaver(conn)
                saver.setup()
                rows.append(("langgraph SqliteSaver", langgraph_rate(saver, RUNS)))
            finally:
                conn.close()
    width = max(len(name) for name, _ in rows)
    for name, rate in rows:
        print(f"{name:<{width}}  {rate:>9,.0f} runs/s" if rate else f"{name:<{width}}  n/a")
    by = dict(rows)
    for ours, theirs in (
        ("wakeful memory", "langgraph InMemorySaver"),
        ("wakeful sqlite", "langgraph SqliteSaver"),
        ("wakeful file", "langgraph SqliteSaver"),
    ):
        if by.get(ours) and by.get(theirs):
            print(f"{ours} / {theirs}: {by[ours] / by[theirs]:.1f}x")  # type: ignore[operator]


if __name__ == "__main__":
    main()
