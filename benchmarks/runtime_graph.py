"""A 3-node linear graph with durability ``sync``: runs per second on the memory, file and
SQLite stores, beside LangGraph's ``InMemorySaver`` and ``SqliteSaver`` on the same graph in
the same run (``pip install 'wakeful[bench]'``), sequentially and from 8 concurrent threads.
``--rounds`` interleaves every store and saver; medians are reported.

Targets (issue 22 restated them; decision 0005 has the bound): on the file and SQLite stores
>= 2x ``SqliteSaver`` sequentially (at equal fsync cost 9 / 4 = 2.25x is the bound) and
>= 5x with 8 concurrent threads; on the memory store >= 5x ``InMemorySaver`` (issue 6).

Concurrent means ``THREADS`` threads of execution, each running its share of the runs one
after the other, each run on a fresh thread id: on wakeful's side asyncio tasks on one
``Runtime`` and store; on LangGraph's side, as users run it, OS threads calling
``graph.invoke`` on one compiled graph whose ``SqliteSaver`` shares one connection
(``check_same_thread=False``, the saver serialises its calls with its own lock).

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

from benchmarks.common import Collector, Result, rounds_argument
from wakeful import open_store
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime, append

RUNS = 300
THREADS = 8


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


async def wakeful_rate(url: str, runs: int, k: int = 1) -> float:
    """Runs per second of ``k`` concurrent tasks, each running its share of ``runs``."""
    nodes = {n: await async_node_factory(n) for n in ("a", "b", "c")}
    g = Graph(State)
    for name, fn in nodes.items():
        g.node(name, fn)
    graph = g.edge(START, "a").edge("a", "b").edge("b", "c").compile()
    async with open_store(url) as store:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10))
        per = runs // k

        async def worker(w: int) -> None:
            for i in range(per):
                handle = await runtime.start(f"t{w}-{i}", graph, {"log": []}, durability="sync")
                await handle.result()

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(k)))
        return per * k / (time.perf_counter() - start)


def langgraph_rate(saver: Any, runs: int, k: int = 1) -> float:
    """``graph.invoke`` runs per second from ``k`` OS threads, each running its share."""
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
    per = runs // k

    def worker(w: int) -> None:
        for i in range(per):
            config: Any = {"configurable": {"thread_id": f"t{w}-{i}"}}
            graph.invoke({"log": []}, config, durability="sync")

    start = time.perf_counter()
    if k == 1:
        worker(0)
    else:
        with ThreadPoolExecutor(max_workers=k) as pool:
            for future in [pool.submit(worker, w) for w in range(k)]:
                future.result()
    return per * k / (time.perf_counter() - start)


def label(name: str, k: int) -> str:
    """``wakeful file`` sequentially, ``wakeful file, 8 threads`` concurrently."""
    return name if k == 1 else f"{name}, {k} threads"


def one_round(runs: int, directory: Path | None) -> tuple[dict[str, float], str | None]:
    rates: dict[str, float] = {}
    skipped: str | None = None
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-", dir=directory) as tmp:
        root = Path(tmp)
        for k in (1, THREADS):  # each store and saver in turn, sequential then concurrent
            rates[label("wakeful memory", k)] = asyncio.run(wakeful_rate("memory://", runs, k))
            url = f"file://{root / f'fs-{k}'}"
            rates[label("wakeful file", k)] = asyncio.run(wakeful_rate(url, runs, k))
            url = f"sqlite:///{root / f'w-{k}.db'}"
            rates[label("wakeful sqlite", k)] = asyncio.run(wakeful_rate(url, runs, k))
            try:
                from langgraph.checkpoint.memory import InMemorySaver
                from langgraph.checkpoint.sqlite import SqliteSaver
            except ImportError as exc:
                skipped = f"LangGraph columns skipped ({exc}); pip install 'wakeful[bench]'"
                continue
            rates[label("langgraph InMemorySaver", k)] = langgraph_rate(InMemorySaver(), runs, k)
            # One connection shared by the threads, as LangGraph documents SqliteSaver.
            conn = sqlite3.connect(root / f"lg-{k}.db", check_same_thread=False)
            try:
                saver = SqliteSaver(conn)
                saver.setup()
                rates[label("langgraph SqliteSaver", k)] = langgraph_rate(saver, runs, k)
            finally:
                conn.close()
    return rates, skipped


PAIRS: tuple[tuple[str, str, float | None], ...] = (
    # (ours, anchor, target)
    ("wakeful memory", "langgraph InMemorySaver", 5.0),
    ("wakeful file", "langgraph SqliteSaver", 2.0),
    ("wakeful sqlite", "langgraph SqliteSaver", 2.0),
    (label("wakeful memory", THREADS), label("langgraph InMemorySaver", THREADS), None),
    (label("wakeful file", THREADS), label("langgraph SqliteSaver", THREADS), 5.0),
    (label("wakeful sqlite", THREADS), label("langgraph SqliteSaver", THREADS), 5.0),
)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runtime_graph")
    parser.add_argument("--runs", type=int, default=RUNS, help="graph runs per measurement")
    parser.add_argument("--dir", type=Path, default=None, help="a directory on the disk to test")
    rounds_argument(parser)
    args = parser.parse_args(argv if argv is not None else [])
    samples: dict[str, list[float]] = {}
    skipped: str | None = None
    for _ in range(args.rounds):  # rounds interleave every store and saver
        rates, skipped = one_round(args.runs, args.dir)
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
    for ours, theirs, target in PAIRS:
        if by.get(ours) and by.get(theirs):
            goal = "" if target is None else f" (target >= {target:g}x)"
            print(f"{ours} / {theirs}: {by[ours] / by[theirs]:.2f}x{goal}")
        out.add(
            ours,
            samples[ours],
            "runs/s",
            anchor=theirs,
            anchor_samples=samples.get(theirs),
            target=target,
            skipped=skipped,
        )
    for theirs in dict.fromkeys(anchor for _, anchor, _ in PAIRS):
        if theirs in samples:
            out.add(theirs, samples[theirs], "runs/s")
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
