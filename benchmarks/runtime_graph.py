"""A 3-node linear graph with durability ``sync``: runs per second on the memory, file and
SQLite stores, beside LangGraph's ``InMemorySaver`` and ``SqliteSaver`` on the same graph in
the same run (``pip install 'wakeful[bench]'``). ``--rounds`` interleaves every store and
saver; medians are reported. Target: >= 5x the LangGraph saver.

Each run starts a fresh thread: the claim with the admission commit (one write), three
tasks, and a checkpoint after each superstep, the last one also releasing the claim: 4
durable writes per run (decision 0004). LangGraph's ``SqliteSaver`` makes 9 SQLite commits
for the same run."""

from __future__ import annotations

import argparse
import asyncio
import operator
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from benchmarks.common import Collector, Result, rounds_argument
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


def one_round(runs: int) -> tuple[dict[str, float], str | None]:
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rates["wakeful memory"] = asyncio.run(wakeful_rate("memory://", runs))
        rates["wakeful file"] = asyncio.run(wakeful_rate(f"file://{root / 'fs'}", runs))
        rates["wakeful sqlite"] = asyncio.run(wakeful_rate(f"sqlite:///{root / 'w.db'}", runs))
        try:
            from langgraph.checkpoint.memory import InMemorySaver
            from langgraph.checkpoint.sqlite import SqliteSaver
        except ImportError as exc:
            return rates, f"LangGraph columns skipped ({exc}); pip install 'wakeful[bench]'"
        rates["langgraph InMemorySaver"] = langgraph_rate(InMemorySaver(), runs)
        conn = sqlite3.connect(root / "lg.db", check_same_thread=False)
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            rates["langgraph SqliteSaver"] = langgraph_rate(saver, runs)
        finally:
            conn.close()
    return rates, None


PAIRS = (
    ("wakeful memory", "langgraph InMemorySaver"),
    ("wakeful file", "langgraph SqliteSaver"),
    ("wakeful sqlite", "langgraph SqliteSaver"),
)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runtime_graph")
    parser.add_argument("--runs", type=int, default=RUNS, help="graph runs per measurement")
    rounds_argument(parser)
    args = parser.parse_args(argv if argv is not None else [])
    samples: dict[str, list[float]] = {}
    skipped: str | None = None
    for _ in range(args.rounds):  # rounds interleave every store and saver
        rates, skipped = one_round(args.runs)
        for name, rate in rates.items():
            samples.setdefault(name, []).append(rate)
    by = {name: statistics.median(values) for name, values in samples.items()}
    if skipped:
        print(skipped)
    print(f"3-node graph, durability sync, {args.runs} runs x {args.rounds} rounds (medians)")
    width = max(len(name) for name in by)
    for name, rate in by.items():
        print(f"{name:<{width}}  {rate:>9,.0f} runs/s")
    out = Collector("runtime_graph")
    for ours, theirs in PAIRS:
        if by.get(ours) and by.get(theirs):
            print(f"{ours} / {theirs}: {by[ours] / by[theirs]:.1f}x")
        out.add(
            ours,
            samples[ours],
            "runs/s",
            anchor=theirs,
            anchor_samples=samples.get(theirs),
            target=5.0,
            skipped=skipped,
        )
    for theirs in ("langgraph InMemorySaver", "langgraph SqliteSaver"):
        if theirs in samples:
            out.add(theirs, samples[theirs], "runs/s")
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
