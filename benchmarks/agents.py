"""The comparison a user faces (issue 22): an agent-like job, a 3-node graph with its state
made durable after each step, run by a fleet of 2 worker processes x 10 concurrent jobs on
one PostgreSQL server, three ways:

- **wakeful**: ``submit`` then ``Worker(concurrency=10)`` in each process (the fleet's own
  queue and checkpoints; each run claims its lease, commits its admission and a checkpoint
  after each superstep, the last one settling the dispatch);
- **pgqueuer + LangGraph**: a pgqueuer job (``QueueManager``, asyncpg, ``batch_size=5,
  max_concurrent_tasks=10``) runs the same graph built with LangGraph's ``StateGraph``,
  compiled with ``AsyncPostgresSaver`` (a psycopg pool of 10 per process, the saver's
  documented connection settings), ``durability="sync"``;
- **procrastinate + LangGraph**: the same graph and saver in a procrastinate task
  (``run_worker_async(concurrency=10, wait=False)``).

Each system gets a fresh database on the same server, ``--n`` jobs queued (untimed), then
both processes are told to go at the same instant and drain the queue; jobs/s = n / (go ->
the later process done). Per job: PostgreSQL transactions (``pg_stat_database``), the
server's CPU (the database's backends, ``/proc/<pid>/schedstat``) and the worker processes'
CPU (``benchmarks.pgcost``). Every measurement checks that each job ran its three nodes
exactly once and that its final state is durable (the thread's last checkpoint), and fails
loudly otherwise. Rounds interleave the systems; medians are reported. Target: wakeful
>= 3x each in jobs/s.

Run ``python -m benchmarks.agents [--n 600] [--rounds 3] [--dsn URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import operator
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument
from benchmarks.dispatch import _drained, _emit, _go, collect, expect_ready, send
from benchmarks.pgcost import Costs, ProcessCpu, ServerCost, add_costs, print_costs, record_cost
from wakeful import open_store
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.runtime import START, ClaimPolicy, Graph, append

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2
CONCURRENCY = 10
CHILD_TIMEOUT = 240.0
SYSTEMS = ("wakeful", "pgqueuer + LangGraph", "procrastinate + LangGraph")
NODES = ("a", "b", "c")
TARGET = 3.0


class State(TypedDict):
    log: Annotated[list[str], append]


class LGState(TypedDict):
    log: Annotated[list[str], operator.add]


def _step(tag: str, counter: list[int]) -> Callable[[dict[str, Any]], Any]:
    async def step(state: dict[str, Any]) -> dict[str, Any]:
        counter[0] += 1
        return {"log": [tag]}

    return step


def langgraph_graph(saver: Any, counter: list[int]) -> Any:
    from langgraph.graph import END, StateGraph
    from langgraph.graph import START as LG_START

    builder = StateGraph(LGState)
    for name in NODES:
        step: Any = _step(name, counter)
        builder.add_node(name, step)
    builder.add_edge(LG_START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder.compile(checkpointer=saver)


async def run_langgraph(graph: Any, thread_id: str) -> None:
    config = {"configurable": {"thread_id": thread_id}}
    await graph.ainvoke({"log": []}, config, durability="sync")


@contextlib.asynccontextmanager
async def saver_pool(dsn: str) -> Any:
    """LangGraph's ``AsyncPostgresSaver`` on a pool of 10, as its documentation sets it up."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(dsn, min_size=10, max_size=10, kwargs=kwargs) as pool:
        await pool.wait()
        yield AsyncPostgresSaver(pool)  # type: ignore[arg-type]


# ------------------------------------------------------------------ worker processes


async def wakeful_child(dsn: str) -> None:
    counter = [0]
    g = Graph(State, name="agent")
    for name in NODES:
        g.node(name, _step(name, counter))
    graph = g.edge(START, "a").edge("a", "b").edge("b", "c").compile()
    async with open_store(dsn) as store:
        worker = Worker(
            store,
            Registry().add("agent", graph),
            concurrency=CONCURRENCY,
            claims=ClaimPolicy(ttl=30, renew_every=10),
            wake=LocalWake(),
            poll_interval=0.5,
            relay=False,
        )
        await _go()
        start = time.monotonic()
        running = asyncio.create_task(worker.run())
        drained = asyncio.create_task(_drained(worker))
        await asyncio.wait([running, drained], return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            drained.cancel()
            await running
        await worker.stop(grace=5)
        await running
        end = time.monotonic()
    _emit({"start": start, "end": end, "steps": counter[0], "jobs": worker.stats.done})


async def pgqueuer_child(dsn: str) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    counter, jobs = [0], [0]
    conn = await asyncpg.connect(dsn)
    try:
        async with saver_pool(dsn) as saver:
            graph = langgraph_graph(saver, counter)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            async def agent(job: Job) -> None:
                await run_langgraph(graph, f"t{job.id}")
                jobs[0] += 1

            qm.entrypoint("agent")(agent)
            await _go()
            start = time.monotonic()
            await qm.run(
                batch_size=CONCURRENCY // 2,
                max_concurrent_tasks=CONCURRENCY,
                mode=QueueExecutionMode.drain,
                dequeue_timeout=timedelta(seconds=5),
            )
            end = time.monotonic()
    finally:
        await conn.close()
    _emit({"start": start, "end": end, "steps": counter[0], "jobs": jobs[0]})


async def procrastinate_child(dsn: str) -> None:
    from benchmarks.dispatch import _procrastinate

    procrastinate = _procrastinate()
    counter, jobs = [0], [0]
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    async with saver_pool(dsn) as saver:
        graph = langgraph_graph(saver, counter)

        async def agent(thread: str) -> None:
            await run_langgraph(graph, thread)
            jobs[0] += 1

        app.task(name="agent")(agent)
        async with app.open_async():
            await _go()
            start = time.monotonic()
            await app.run_worker_async(
                concurrency=CONCURRENCY, wait=False, install_signal_handlers=False
            )
            end = time.monotonic()
    _emit({"start": start, "end": end, "steps": counter[0], "jobs": jobs[0]})


RUNNERS = {
    "wakeful": wakeful_child,
    "pgqueuer + LangGraph": pgqueuer_child,
    "procrastinate + LangGraph": procrastinate_child,
}


async def _serve(system: str) -> None:
    """One worker process per system for the whole benchmark (as ``dispatch._serve``):
    ``prepare DSN`` sets up a drain (READY), ``go`` starts it, RESULT reports it."""
    print("READY", flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        command, dsn = line.split()
        if command != "prepare":
            raise SystemExit(f"expected 'prepare DSN', got {line!r}")
        await RUNNERS[system](dsn)


# ------------------------------------------------------------------ the parent


class Workers:
    def __init__(self) -> None:
        self.pools: dict[str, list[subprocess.Popen[str]]] = {}

    def get(self, system: str) -> list[subprocess.Popen[str]]:
        if system not in self.pools:
            key = str(SYSTEMS.index(system))
            self.pools[system] = [
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.agents", "--child", key],
                    cwd=ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(WORKERS)
            ]
            for child in self.pools[system]:
                expect_ready(child)
        return self.pools[system]

    def close(self) -> None:
        for children in self.pools.values():
            for child in children:
                with contextlib.suppress(OSError):
                    assert child.stdin is not None
                    child.stdin.close()
            for child in children:
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        self.pools.clear()


def drain(pool: Workers, system: str, db: Database, n: int, costs: Costs) -> float:
    children = pool.get(system)

    def kill_all() -> None:
        for child in children:
            child.kill()

    watchdog = threading.Timer(CHILD_TIMEOUT, kill_all)
    watchdog.start()
    cost = ServerCost(db.admin_dsn, db.name)
    clients = ProcessCpu([child.pid for child in children])
    try:
        for child in children:
            send(child, f"prepare {db.dsn}")
        for child in children:
            expect_ready(child)
        with cost:
            clients.start()
            go = time.monotonic()
            for child in children:
                send(child, "go")
            results = [collect(child) for child in children]
            cost.clients = clients.stop()
    finally:
        watchdog.cancel()
    steps = sum(int(r["steps"]) for r in results)
    jobs = sum(int(r["jobs"]) for r in results)
    if steps != len(NODES) * n or jobs != n:
        raise RuntimeError(f"{system}: {jobs} jobs and {steps} steps for {n} jobs: {results}")
    record_cost(costs, (system, CONCURRENCY), cost, n)
    return n / (max(float(r["end"]) for r in results) - go)


async def _queue(system: str, dsn: str, n: int) -> None:
    """Queue ``n`` jobs (and set up each library's tables)."""
    if system == "wakeful":
        async with open_store(dsn) as store:
            sem = asyncio.Semaphore(32)

            async def one(i: int) -> None:
                async with sem:
                    await submit(store, f"t{i}", "agent", {"log": []}, dispatch_id=f"d{i}")

            await asyncio.gather(*(one(i) for i in range(n)))
        return
    async with saver_pool(dsn) as saver:
        await saver.setup()
    if system == "pgqueuer + LangGraph":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            await queries.enqueue(["agent"] * n, [None] * n, [0] * n)
        finally:
            await conn.close()
        return
    from benchmarks.dispatch import _procrastinate

    procrastinate = _procrastinate()
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def agent(thread: str) -> None:
        pass

    task = app.task(name="agent")(agent)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await task.batch_defer_async(*({"thread": f"t{i}"} for i in range(n)))


async def _verify(system: str, dsn: str, n: int) -> None:
    """Every job's thread ends with its three steps in a durable checkpoint."""
    if system == "wakeful":
        async with open_store(dsn) as store:
            for i in random.Random(n).sample(range(n), min(n, 20)):
                snap = await store.read(f"t{i}")
                cp = snap.checkpoint if snap is not None else None
                if cp is None or cp.status != "completed" or cp.state["log"] != list(NODES):
                    raise RuntimeError(f"wakeful: thread t{i} ended as {cp}")
        return
    async with saver_pool(dsn) as saver:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(DISTINCT thread_id) FROM checkpoints").fetchone()
            threads = [r[0] for r in conn.execute("SELECT DISTINCT thread_id FROM checkpoints")]
        if row is None or row[0] != n:
            raise RuntimeError(f"{system}: {row} threads checkpointed, {n} jobs")
        for thread in random.Random(n).sample(threads, min(n, 20)):
            state = await saver.aget({"configurable": {"thread_id": thread}})
            if state is None or state["channel_values"].get("log") != list(NODES):
                raise RuntimeError(f"{system}: thread {thread} ended as {state}")


def measure(pool: Workers, system: str, db: Database, n: int, costs: Costs) -> float:
    db.create()
    try:
        asyncio.run(_queue(system, db.dsn, n))
        rate = drain(pool, system, db, n, costs)
        asyncio.run(_verify(system, db.dsn, n))
        return rate
    finally:
        db.drop()


def _installed() -> str | None:
    for module in ("pgqueuer", "asyncpg", "procrastinate", "langgraph.checkpoint.postgres"):
        try:
            __import__(module)
        except ImportError as exc:
            return f"{module} is not installed ({exc.name}); pip install 'wakeful[bench]'"
    return None


def run(args: argparse.Namespace) -> list[Result]:
    missing = _installed()
    systems = ["wakeful"] if missing else list(SYSTEMS)
    samples: dict[str, list[float]] = {}
    costs: Costs = {}
    pool = Workers()
    pid = os.getpid()
    try:
        for _ in range(args.rounds):
            for system in systems:
                db = Database(args.dsn, f"wakeful_bench_agents_{SYSTEMS.index(system)}_{pid}")
                samples.setdefault(system, []).append(measure(pool, system, db, args.n, costs))
    finally:
        pool.close()
    out = Collector("agents")
    name = f"wakeful, {WORKERS} processes x {CONCURRENCY} jobs"
    for theirs in SYSTEMS[1:]:
        out.add(
            f"{name} vs {theirs}",
            samples["wakeful"],
            "jobs/s",
            anchor=f"{theirs} (AsyncPostgresSaver), {WORKERS} processes x {CONCURRENCY}",
            anchor_samples=samples.get(theirs),
            target=TARGET,
            skipped=missing,
        )
    add_costs(out, costs, systems, CONCURRENCY, WORKERS, "wakeful")
    print(
        f"agents: {args.n} jobs of a 3-node graph (durable after each step) per measurement, "
        f"{WORKERS} processes x {CONCURRENCY}, {args.rounds} rounds (medians, jobs/s)"
    )
    for system in systems:
        values = samples[system]
        each = ", ".join(f"{v:,.0f}" for v in values)
        print(f"  {system:<28}{statistics.median(values):>10,.0f}  ({each})")
    print_costs(costs)
    if missing:
        print(f"skipped: {missing}")
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    argv = list(argv if argv is not None else [])
    if argv[:1] == ["--child"]:
        asyncio.run(_serve(SYSTEMS[int(argv[1])]))
        return []
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agents")
    parser.add_argument("--n", type=int, default=600, help="jobs per measurement")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    rounds_argument(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
