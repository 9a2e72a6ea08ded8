"""Benchmark: a LangGraph graph on ``WakefulSaver`` beside LangGraph's own savers.

Run ``python -m benchmarks.langgraph_saver [--runs 200] [--rounds 3] [--dsn DSN] [--dir
PATH]``. The same 3-node linear LangGraph graph, ``durability="sync"``, each run on a fresh
thread, in runs per second (rounds interleave every saver; medians reported):

- SQLite, on the same disk: ``WakefulSaver`` over the SQLite store beside ``SqliteSaver``
  (``graph.invoke``; concurrent: OS threads sharing its connection, as it is meant to be
  shared) and ``AsyncSqliteSaver`` (``graph.ainvoke``), sequential and 8 concurrent threads;
- PostgreSQL, on the same server: ``WakefulSaver`` over the PostgreSQL store (pool of 16)
  beside ``AsyncPostgresSaver`` (pool of 16), sequential and 16 concurrent threads;
- ``InMemorySaver`` (no storage), sequential and 8 concurrent: what LangGraph itself costs,
  the ceiling every saver runs under on this CPU.

``WakefulSaver`` runs with its default ``fencing="auto"``: every run claims its thread
before the first node (a durable write LangGraph's savers do not make), and ``put`` and
``put_writes`` calls that LangGraph submits together share one fenced, fsynced commit (the
graph's run: 1 claim + 5 commits, against 9 commits on LangGraph's savers). Targets
(issue 20): >= 1x sequential on each store; >= 3x ``AsyncSqliteSaver`` at 8 concurrent
threads; >= 2x ``AsyncPostgresSaver`` at 16.

Then a long thread's cold read (``benchmarks.langgraph_history``): the first ``aget_tuple``
in a new process after 10, 100 and 1,000 chat turns, its time and peak RSS (issue 35:
<= 1.5x from 10 to 1,000 turns). ``--history-only`` runs only that part, ``--no-history``
skips it.
Needs the ``bench`` extra (LangGraph's savers); without it the module is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

from benchmarks import langgraph_history
from benchmarks.common import DEFAULT_DSN, Collector, Database, Result
from wakeful.langgraph import WakefulSaver

RUNS = 200
SQLITE_THREADS = 8
POSTGRES_THREADS = 16


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def graph(saver: Any) -> Any:
    """START -> a -> b -> c -> END."""
    builder = StateGraph(State)
    for name in ("a", "b", "c"):
        builder.add_node(name, lambda state, tag=name: {"log": [tag]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder.compile(checkpointer=saver)


def config(label: str, i: int) -> Any:
    return {"configurable": {"thread_id": f"{label}-{i}"}}


async def async_rate(saver: Any, runs: int, k: int, label: str) -> float:
    """Runs per second of ``k`` tasks, each running its share of ``runs`` in turn."""
    compiled = graph(saver)
    per = runs // k

    async def worker(w: int) -> None:
        for i in range(per):
            result = await compiled.ainvoke(
                {"log": []}, config(f"{label}-{w}", i), durability="sync"
            )
            assert result["log"] == ["a", "b", "c"]

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(k)))
    return per * k / (time.perf_counter() - start)


def sync_rate(saver: Any, runs: int, k: int, label: str) -> float:
    """``graph.invoke`` runs per second from ``k`` OS threads."""
    compiled = graph(saver)
    per = runs // k

    def worker(w: int) -> None:
        for i in range(per):
            compiled.invoke({"log": []}, config(f"{label}-{w}", i), durability="sync")

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=k) as pool:
        for future in [pool.submit(worker, w) for w in range(k)]:
            future.result()
    return per * k / (time.perf_counter() - start)


async def wakeful_rate(url: str, runs: int, k: int, **options: Any) -> float:
    async with WakefulSaver.from_url(url, **options) as saver:
        return await async_rate(saver, runs, k, "wk")


async def async_sqlite_rate(path: Path, runs: int, k: int) -> float:
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.setup()
        return await async_rate(saver, runs, k, "lg")


def sqlite_saver_rate(path: Path, runs: int, k: int) -> tuple[float, str]:
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        synchronous = str(conn.execute("PRAGMA synchronous").fetchone()[0])
        return sync_rate(saver, runs, k, "lg"), synchronous
    finally:
        conn.close()


async def async_postgres_rate(dsn: str, runs: int, k: int) -> float:
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=POSTGRES_THREADS,
        max_size=POSTGRES_THREADS,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0},
    )
    await pool.open(wait=True)
    try:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        return await async_rate(saver, runs, k, f"lg{k}")
    finally:
        await pool.close()


def sqlite_round(directory: Path, runs: int) -> tuple[dict[str, float], str]:
    rates: dict[str, float] = {}
    synchronous = "?"
    for k in (1, SQLITE_THREADS):
        rates[f"InMemorySaver x{k}"] = asyncio.run(async_rate(InMemorySaver(), runs, k, "mem"))
        rates[f"wakeful sqlite x{k}"] = asyncio.run(
            wakeful_rate(f"sqlite:///{directory / f'wakeful-{k}.db'}", runs, k)
        )
        rates[f"AsyncSqliteSaver x{k}"] = asyncio.run(
            async_sqlite_rate(directory / f"async-{k}.db", runs, k)
        )
        rates[f"SqliteSaver x{k}"], synchronous = sqlite_saver_rate(
            directory / f"sync-{k}.db", runs, k
        )
    return rates, f"SqliteSaver: WAL, PRAGMA synchronous={synchronous} (2 = FULL)"


def postgres_round(admin_dsn: str, runs: int, r: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    for k in (1, POSTGRES_THREADS):
        ours = Database(admin_dsn, f"wakeful_bench_lg_{os.getpid()}_{r}_{k}").create()
        theirs = Database(admin_dsn, f"wakeful_bench_lgp_{os.getpid()}_{r}_{k}").create()
        try:
            rates[f"wakeful postgres x{k}"] = asyncio.run(_wakeful_postgres(ours.dsn, runs, k))
            rates[f"AsyncPostgresSaver x{k}"] = asyncio.run(
                async_postgres_rate(theirs.dsn, runs, k)
            )
        finally:
            ours.drop()
            theirs.drop()
    return rates


async def _wakeful_postgres(dsn: str, runs: int, k: int) -> float:
    from wakeful.store.postgres import open_postgres_store

    store = await open_postgres_store(dsn, pool_size=POSTGRES_THREADS)
    saver = WakefulSaver(store)
    try:
        return await async_rate(saver, runs, k, "wk")
    finally:
        await saver.aclose()
        await store.close()


COMPARISONS: tuple[tuple[str, str, str, float], ...] = (
    # (label, ours, anchor, target)
    ("SQLite, sequential", "wakeful sqlite x1", "AsyncSqliteSaver x1", 1.0),
    ("SQLite, sequential (vs the sync saver)", "wakeful sqlite x1", "SqliteSaver x1", 1.0),
    (
        f"SQLite, {SQLITE_THREADS} concurrent threads",
        f"wakeful sqlite x{SQLITE_THREADS}",
        f"AsyncSqliteSaver x{SQLITE_THREADS}",
        3.0,
    ),
    ("PostgreSQL, sequential", "wakeful postgres x1", "AsyncPostgresSaver x1", 1.0),
    (
        f"PostgreSQL, {POSTGRES_THREADS} concurrent threads",
        f"wakeful postgres x{POSTGRES_THREADS}",
        f"AsyncPostgresSaver x{POSTGRES_THREADS}",
        2.0,
    ),
)


def results(samples: dict[str, list[float]]) -> list[Result]:
    out = Collector("langgraph_saver")
    for label, ours, anchor, target in COMPARISONS:
        if ours not in samples:
            out.skip(f"WakefulSaver, {label}", "runs/s", "not measured", anchor=anchor)
            continue
        out.add(
            f"WakefulSaver, {label}",
            samples[ours],
            "runs/s",
            anchor=f"LangGraph {anchor.replace(' x', ', ')} thread(s)",
            anchor_samples=samples.get(anchor),
            target=target,
        )
    for key in samples:
        if not key.startswith("wakeful"):
            out.add(f"LangGraph {key.replace(' x', ', ')} thread(s)", samples[key], "runs/s")
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=RUNS, help="graph runs per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to test")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--history-only", action="store_true", help="only the cold reads")
    parser.add_argument("--no-history", action="store_true", help="skip the cold reads")
    args = parser.parse_args(argv if argv is not None else [])
    samples: dict[str, list[float]] = {}
    note = ""
    history: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-lg-", dir=args.dir) as tmp:
        if not args.no_history:
            history = langgraph_history.measure(Path(tmp), args.rounds)
            langgraph_history.report(history)
            if args.history_only:
                return history
        for r in range(args.rounds):
            directory = Path(tmp) / f"round-{r}"
            directory.mkdir()
            rates, note = sqlite_round(directory, args.runs)
            if not args.no_postgres:
                rates.update(postgres_round(args.dsn, args.runs, r))
            for key, rate in rates.items():
                samples.setdefault(key, []).append(rate)
    med = {key: statistics.median(values) for key, values in samples.items()}
    print(
        f"3-node LangGraph graph, durability sync, {args.runs} runs per measurement, "
        f"{args.rounds} rounds (medians); {note}"
    )
    width = max(len(key) for key in med)
    for key, rate in med.items():
        print(f"{key:<{width}}  {rate:>9,.1f} runs/s")
    for label, ours, anchor, target in COMPARISONS:
        if ours in med and anchor in med:
            ratio = med[ours] / med[anchor]
            print(f"{label}: {ratio:.2f}x {anchor} (target >= {target:g}x)")
    return results(samples) + history


if __name__ == "__main__":
    main(sys.argv[1:])
