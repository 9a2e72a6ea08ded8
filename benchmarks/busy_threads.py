"""Busy threads (issue 36): how long from a submission with ``if_busy="interrupt"`` (or
``"rollback"``) on a busy thread until the new run is running, with wakes on.

Per sample, a fresh thread: a run of graph ``hold`` starts and waits in its node; then the
benchmark submits a run of graph ``next`` with the policy and measures the time from just
before that ``submit`` until ``next``'s node starts (both in this process, one monotonic
clock). In between: the submission is queued and the busy run fenced (one store call), the
wake reaches the worker, the worker leases the cancel intent and commits the busy run's
ending (for ``rollback``: the branch back), which admits the new run, and the worker leases
and starts it. The busy run is then let go (its commit is refused: it was fenced) and the
new run ends before the next sample.

SQLite: one file, the worker and the submitter share a ``LocalWake``. PostgreSQL: the
submitter and the worker each open their own store and their own ``PostgresWake``, so the
wake travels through the server (LISTEN/NOTIFY), as between processes. The worker polls at
most every ``--poll`` seconds (1 s: a lost wake would show), renews every 2 s.

Figures only (no target): the issue's bound is "within one renew interval at worst and
<= 0.5 s p95 with wakes on" (docs/busy-threads.md lists the last run's figures)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument
from wakeful import open_store
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext

POLICIES = ("interrupt", "rollback")


class State(TypedDict, total=False):
    n: int


class Probe:
    """The two graphs, and what their nodes tell the benchmark."""

    def __init__(self) -> None:
        self.held: dict[str, asyncio.Event] = {}
        self.release: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Future[float]] = {}

    def expect(self, thread_id: str) -> None:
        self.held[thread_id] = asyncio.Event()
        self.release[thread_id] = asyncio.Event()
        self.started[thread_id] = asyncio.get_running_loop().create_future()

    async def hold(self, state: State, ctx: NodeContext) -> dict[str, Any]:
        self.held[ctx.thread_id].set()
        await self.release[ctx.thread_id].wait()
        return {"n": 1}

    async def next(self, state: State, ctx: NodeContext) -> dict[str, Any]:
        started = self.started[ctx.thread_id]
        if not started.done():
            started.set_result(time.monotonic())
        return {"n": 2}

    def registry(self) -> Registry:
        registry = Registry()
        for name, fn in (("hold", self.hold), ("next", self.next)):
            registry.add(name, Graph(State, name=name).node(name, fn).edge(START, name).compile())
        return registry


async def _done(store: Any, dispatch_id: str, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while True:
        d = await store.get_dispatch(dispatch_id)
        if d is not None and d.status == "done":
            return
        if time.monotonic() > end:
            raise RuntimeError(f"dispatch {dispatch_id} did not finish: {d}")
        await asyncio.sleep(0.01)


async def measure(url: str, policy: str, n: int, poll: float, pg: bool) -> list[float]:
    """``n`` latencies (seconds) of ``policy`` submissions against the store at ``url``."""
    probe = Probe()
    worker_store = await open_store(url)
    submit_store = await open_store(url) if pg else worker_store
    if pg:
        from wakeful.fleet.pgwake import PostgresWake

        worker_wake: Any = PostgresWake(url)
        submit_wake: Any = PostgresWake(url)
    else:
        worker_wake = submit_wake = LocalWake()
    worker = Worker(
        worker_store,
        probe.registry(),
        concurrency=4,
        claims=ClaimPolicy(ttl=6, renew_every=2),
        wake=worker_wake,
        poll_interval=poll,
    )
    running = asyncio.create_task(worker.run())
    latencies = []
    try:
        for i in range(n):
            thread = f"{policy}-{i}"
            probe.expect(thread)
            await submit(submit_store, thread, "hold", {}, dispatch_id=f"h-{thread}",
                         wake=submit_wake)  # fmt: skip
            await asyncio.wait_for(probe.held[thread].wait(), 30)
            t0 = time.monotonic()
            await submit(submit_store, thread, "next", {}, dispatch_id=f"n-{thread}",
                         wake=submit_wake, if_busy=policy)  # type: ignore[arg-type]  # fmt: skip
            started = await asyncio.wait_for(probe.started[thread], 30)
            latencies.append(started - t0)
            probe.release[thread].set()
            await _done(worker_store, f"n-{thread}")
    finally:
        await worker.stop(grace=5)
        await running
        for wake in {id(worker_wake): worker_wake, id(submit_wake): submit_wake}.values():
            close = getattr(wake, "close", None)
            if close is not None:
                await close()
        if submit_store is not worker_store:
            await submit_store.close()
        await worker_store.close()
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.busy_threads")
    parser.add_argument("--n", type=int, default=40, help="samples per store, policy and round")
    parser.add_argument("--poll", type=float, default=1.0, help="the worker's poll floor (s)")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--no-postgres", action="store_true")
    rounds_argument(parser)
    args = parser.parse_args(argv)
    results = Collector("busy_threads")
    stores = ["sqlite"] if args.no_postgres else ["sqlite", "postgresql"]
    for store in stores:
        for policy in POLICIES:
            p50s, p95s = [], []
            for _ in range(args.rounds):
                with tempfile.TemporaryDirectory(prefix="wakeful-bench-busy-") as tmp:
                    if store == "sqlite":
                        url, db = f"sqlite:///{Path(tmp) / 'busy.db'}", None
                    else:
                        db = Database(args.dsn, f"wakeful_bench_busy_{policy}").create()
                        url = db.dsn
                    try:
                        found = asyncio.run(measure(url, policy, args.n, args.poll, db is not None))
                    finally:
                        if db is not None:
                            db.drop()
                p50s.append(statistics.median(found) * 1000)
                p95s.append(percentile(found, 0.95) * 1000)
            for name, samples in (("p50", p50s), ("p95", p95s)):
                results.add(
                    f"{policy} -> new run running, {store}, wakes on, {name}",
                    samples,
                    "ms",
                    higher_is_better=False,
                    note=f"{args.n} samples per round, poll floor {args.poll:g} s",
                )
    for r in results.results:
        print(
            f"{r.name:55s} {r.value:8.1f} ms  (rounds: {', '.join(f'{s:.1f}' for s in r.samples)})"
        )
    return results.results


if __name__ == "__main__":
    main()
