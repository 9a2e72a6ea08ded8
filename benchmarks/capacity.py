"""Capacity of one PostgreSQL primary (issue 41, docs/capacity.md): what each kind of write
costs the server, and a fleet driven at increasing load until it saturates.

``python -m benchmarks.capacity [--steps 25,50,100,200,400,800] [--seconds 5] [--ops 300]
[--workers 2] [--concurrency 8]``

Runs on a private server it builds (``initdb`` on a free loopback port, ``fsync = on``,
``pg_stat_statements`` preloaded, as the ``postgres`` OS user when run as root), so its CPU
can be read from /proc (every process of that server, exited backends included) and no
other work's WAL is counted. ``--dsn`` is accepted and ignored.

1. **Per operation**, sequentially, ``--ops`` times each: WAL bytes (``pg_current_wal_lsn``
   before and after) and server CPU per operation for a plain commit (a ~1.5 kB checkpoint
   and one event under a claim), a renewal, a stream checkpoint, and a whole dispatch
   (submit, then a worker's ``claim_next``, admission commit and the final commit that
   settles it: a one-node no-op graph drained by an in-process worker).
2. **Saturation**: ``--workers`` worker processes (``concurrency`` runs each, woken through
   ``PostgresWake``) and this process submitting at each offered rate for ``--seconds``;
   per step: completed dispatches/s, p50/p99 of the workers' ``claim_next`` and ``commit``
   calls (as the caller sees them: group commit's queueing included), server CPU seconds
   per second and WAL bytes per dispatch. It stops after the first step whose throughput is
   below 90 % of the offered rate.

On a shared 2-core machine the load generator, the workers and the server compete for the
same cores: the saturation point found is this machine's, not the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import psycopg

from benchmarks.common import Result
from wakeful import open_store
from wakeful.fleet import Registry, Worker, submit
from wakeful.fleet.pgwake import PostgresWake
from wakeful.records import Checkpoint, Commit, EventDraft, StreamCheckpoint
from wakeful.runtime import START, ClaimPolicy, Graph
from wakeful.store.contract import Store

ROOT = Path(__file__).resolve().parent.parent
DB = "capacity"
STANDALONE = """
synchronous_standby_names = ''
fsync = on
full_page_writes = on
shared_preload_libraries = 'pg_stat_statements'
max_connections = 200
"""
STATE = {"notes": "x" * 1400}


class NoopState(TypedDict):
    n: int


def registry() -> Registry:
    async def noop(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": 1}

    graph = Graph(NoopState, name="noop").node("n", noop).edge(START, "n")
    return Registry().add("noop", graph.compile())


def checkpoint(thread: str, version: int) -> Checkpoint:
    return Checkpoint(
        id=f"{thread}-{version}",
        parent=f"{thread}-{version - 1}" if version > 1 else None,
        run_id="run-1",
        status="running",
        state=STATE,
        created_at=datetime.now(UTC),
    )


def wal_lsn(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])


class Meter:
    """WAL bytes and server CPU seconds between ``start`` and ``stop``."""

    def __init__(self, node: Any, url: str) -> None:
        self.node, self.url = node, url

    def start(self) -> None:
        self.wal, self.cpu, self.at = wal_lsn(self.url), self.node.cpu_seconds(), time.monotonic()

    def stop(self) -> tuple[int, float, float]:
        return (
            wal_lsn(self.url) - self.wal,
            self.node.cpu_seconds() - self.cpu,
            time.monotonic() - self.at,
        )


async def per_operation(store: Store, meter: Meter, n: int) -> dict[str, dict[str, float]]:
    """WAL bytes and server CPU ms per operation, each kind run ``n`` times in a row."""
    found: dict[str, dict[str, float]] = {}

    def record(kind: str) -> None:
        wal, cpu, wall = meter.stop()
        found[kind] = {
            "wal_bytes": round(wal / n, 1),
            "server_cpu_ms": round(cpu * 1000 / n, 3),
            "wall_ms": round(wall * 1000 / n, 3),
        }

    claim = await store.claim("ops", "bench", ttl=600)
    meter.start()
    for v in range(1, n + 1):
        draft = (EventDraft(type="step", data={"v": v}),)
        await store.commit(
            "ops",
            Commit(token=claim.token, checkpoint=checkpoint("ops", v), events=draft),
        )
    record("commit")
    meter.start()
    for _ in range(n):
        await store.renew("ops", claim.token, 600)
    record("renewal")
    meter.start()
    for i in range(n):
        await store.stream_checkpoints.put(
            StreamCheckpoint(
                run_id="run-1",
                thread_id="ops",
                model="m",
                partial_text="x" * (i % 400),
                token=claim.token,
            )
        )
    await store.stream_checkpoints.get("run-1")  # the puts are grouped: wait for them
    await asyncio.sleep(0.2)
    record("stream checkpoint")
    meter.start()
    for i in range(n):
        await submit(store, f"d{i:05d}", "noop", {}, dispatch_id=f"dp-{i}")
    worker = Worker(store, registry(), concurrency=4, poll_interval=0.05, relay=False)
    running = asyncio.create_task(worker.run())
    while worker.stats.done < n:  # noqa: ASYNC110 - the worker's own counter
        await asyncio.sleep(0.02)
    await worker.stop(grace=5)
    await running
    record("dispatch")
    return found


# ---------------------------------------------------------------- the worker processes


async def child(url: str, worker_id: str, concurrency: int) -> None:
    """A worker whose ``claim_next`` and ``commit`` calls are timed; stdin: ``mark``
    (forget the times), ``report`` (print their percentiles), ``stop``."""
    store = await open_store(url, pool_size=concurrency + 2)
    times: dict[str, list[float]] = {"claim_next": [], "commit": []}
    for name, spent in times.items():
        original = getattr(store, name)

        async def timed(*args: Any, __call: Any = original, __spent: Any = spent, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return await __call(*args, **kw)
            finally:
                __spent.append(time.perf_counter() - started)

        setattr(store, name, timed)
    wake = PostgresWake(url)
    worker = Worker(
        store,
        registry(),
        concurrency=concurrency,
        claims=ClaimPolicy(ttl=30),
        wake=wake,
        worker_id=worker_id,
        poll_interval=1.0,
        relay=False,
    )
    running = asyncio.create_task(worker.run())
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while (line := (await loop.run_in_executor(None, sys.stdin.readline)).strip()) != "stop":
        if line == "mark":
            for spent in times.values():
                spent.clear()
        elif line == "report":
            print(json.dumps({k: percentiles(v) for k, v in times.items()}), flush=True)
    await worker.stop(grace=5)
    await running
    await wake.close()
    await store.close()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"n": len(ordered), "p50_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000}


def ask(children: list[subprocess.Popen[str]], line: str) -> list[dict[str, Any]]:
    for c in children:
        assert c.stdin is not None
        c.stdin.write(line + "\n")
        c.stdin.flush()
    if line != "report":
        return []
    found = []
    for c in children:
        assert c.stdout is not None
        found.append(json.loads(c.stdout.readline()))
    return found


def merged(reports: list[dict[str, Any]], call: str) -> dict[str, float]:
    """The worst p99 and the mean p50 over the workers (each worker's own distribution)."""
    parts = [r[call] for r in reports if r[call]["n"]]
    if not parts:
        return {"n": 0}
    return {
        "n": sum(p["n"] for p in parts),
        "p50_ms": round(statistics.mean(p["p50_ms"] for p in parts), 2),
        "p99_ms": round(max(p["p99_ms"] for p in parts), 2),
    }


async def done_count(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM wakeful.dispatches WHERE status = 'done'")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def step(
    store: Store, url: str, meter: Meter, children: list[Any], rate: int, seconds: float, at: int
) -> tuple[dict[str, Any], int]:
    """Offer ``rate`` dispatches/s for ``seconds``; returns the step's figures."""
    wake = PostgresWake(url)
    ask(children, "mark")
    before = await done_count(url)
    meter.start()
    started = time.monotonic()
    pending: set[asyncio.Task[Any]] = set()
    n = int(rate * seconds)
    for i in range(n):
        due = started + i / rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        task = asyncio.create_task(
            submit(store, f"s{at + i:07d}", "noop", {}, dispatch_id=f"s-{at + i}", wake=wake)
        )
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_until_done(url, before + n), 2.0)
    completed = await done_count(url) - before
    wal, cpu, wall = meter.stop()
    reports = ask(children, "report")
    await wake.close()
    return {
        "offered_per_s": rate,
        "completed_per_s": round(completed / wall, 1),
        "claim_next": merged(reports, "claim_next"),
        "commit": merged(reports, "commit"),
        "server_cpu_per_s": round(cpu / wall, 3),
        "wal_bytes_per_dispatch": round(wal / max(1, completed)),
    }, at + n


async def _until_done(url: str, target: int) -> None:
    while await done_count(url) < target:  # noqa: ASYNC110 - polls the store
        await asyncio.sleep(0.05)


def spawn(url: str, workers: int, concurrency: int) -> list[subprocess.Popen[str]]:
    command = [sys.executable, "-m", "benchmarks.capacity", "--child", url]
    return [
        subprocess.Popen(
            [*command, f"w{i}", str(concurrency)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.pgcluster import Node

    node = await asyncio.to_thread(Node.init, None, STANDALONE)
    children: list[subprocess.Popen[str]] = []
    try:
        await asyncio.to_thread(node.start)
        with psycopg.connect(node.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        url = node.url(DB)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        meter = Meter(node, url)
        store = await open_store(url, pool_size=8)
        try:
            costs = await per_operation(store, meter, args.ops)
            children = await asyncio.to_thread(spawn, url, args.workers, args.concurrency)
            for c in children:
                assert c.stdout is not None and c.stdout.readline().strip() == "ready"
            steps, at = [], 0
            for rate in args.steps:
                figures, at = await step(store, url, meter, children, rate, args.seconds, at)
                print(json.dumps(figures), flush=True)
                steps.append(figures)
                if figures["completed_per_s"] < 0.9 * rate:
                    break
            statements = top_statements(url)
        finally:
            await store.close()
    finally:
        for c in children:
            with contextlib.suppress(Exception):
                ask([c], "stop")
                c.wait(timeout=30)
            if c.poll() is None:
                c.kill()
        await asyncio.to_thread(node.remove)
    return {"per_operation": costs, "steps": steps, "statements": statements}


def top_statements(url: str) -> list[dict[str, Any]]:
    """The statements that took most server time, with calls and mean ms and WAL bytes."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 70), calls,"
            " round(mean_exec_time::numeric, 3), round(wal_bytes / calls)"
            " FROM pg_stat_statements WHERE calls > 0 ORDER BY total_exec_time DESC LIMIT 8"
        ).fetchall()
    return [
        {"query": q, "calls": c, "mean_ms": float(m), "wal_bytes": int(w)} for q, c, m, w in rows
    ]


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity")
    parser.add_argument("--steps", default="25,50,100,200,400,800")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="accepted; one round is run")
    parser.add_argument("--dsn", default=None, help="ignored: the server is private")
    parser.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        asyncio.run(child(args.child[0], args.child[1], int(args.child[2])))
        return []
    args.steps = [int(s) for s in args.steps.split(",")]
    found = asyncio.run(run(args))
    print(json.dumps(found, indent=2))
    results = [
        Result("capacity", f"{kind}: WAL bytes", c["wal_bytes"], "B", higher_is_better=False)
        for kind, c in found["per_operation"].items()
    ]
    results += [
        Result("capacity", f"{kind}: server CPU", c["server_cpu_ms"], "ms", higher_is_better=False)
        for kind, c in found["per_operation"].items()
    ]
    best = max(found["steps"], key=lambda s: s["completed_per_s"])
    results.append(Result("capacity", "dispatches/s at saturation", best["completed_per_s"], "/s"))
    return results


if __name__ == "__main__":
    main()
