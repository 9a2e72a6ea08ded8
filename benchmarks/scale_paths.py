"""Read and claim paths against deployment size (issue 27): each must stay flat.

Run ``python -m benchmarks.scale_paths [--sizes 1000,100000,1000000] [--calls 20]
[--rounds 3] [--dsn URL] [--max-events N] [--stores sqlite,postgresql]``.

For each size (committed threads) a store is built with set-based inserts
(``benchmarks.scale_data``: the public API would need most of an hour for a million threads)
on SQLite and on PostgreSQL (a fresh database, autovacuum off for its tables so "without
statistics" stays so): ``size`` committed threads over ten tenants, ``size / 10`` pending
dispatches (at least 1,000, at most 100,000) on threads without commits, ``size / 100``
leased ones (at most 10,000) held by live claims, one done dispatch per thread, a big thread
of ``min(10 * size, --max-events)`` events, and a quiet tenant with one thread. Each path is
then called ``--calls`` times per round through the store API, first without statistics and
again after ``ANALYZE``; the figure is the median call. A path is flat when its time at the
largest size is at most 1.5x its time at the smallest (per store, per statistics state).

What makes the sizes comparable (decision 0027, "Second round"): the stores of every size
are open at once and take turns call by call, so load from elsewhere on the machine hits
them alike; ``claim_next`` puts each claimed dispatch back (a zero-delay retry), so every
call of every round and state claims from the queue as built instead of draining the small
store's; and the builder writes each row once (no UPDATE leaving dead versions that only the
larger sizes' first pages stepped over).

Paths: ``read`` of a thread, the tail of the big thread's events (``events_after``), an SSE
resume on it (what the server's stream routes read before their first frame: the thread, a
one-event probe, the first page of 100), the tail of its messages, the first thread page
(operator and tenant), the first pending page (operator), a tenant's dispatch page (the
quiet tenant's: <= 20 ms whatever the others hold; and a busy tenant's), one thread's
dispatches of one status, ``queue_depths`` (what a ``/metrics`` scrape calls, bound 10,000),
``claim_next`` (with ``size`` delayed dispatches ahead, issue 38), ``due_schedules`` (with
``size / 10`` schedules, at most 100,000, none due), and time travel's reads (issue 37): a
page of the big thread's history (``min(size / 100, 10,000)`` checkpoints, at least 100) at
its head and below a cursor in its middle, and one checkpoint by id.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument
from benchmarks.pgcost import cpu_ns
from benchmarks.scale_data import BIG, QUIET, Shape, fill_sqlite, postgres_statements
from wakeful import open_store
from wakeful.records import Retry
from wakeful.store.contract import Store

FLAT = 1.5
TENANT_PAGE_MS = 20.0
SCRAPE_MS = 20.0
SCRAPE_BOUND = 10_000
"""The server's default ``queue_depth_bound``."""

RETRY = Retry(delay=0.0)
Call = Callable[[Store], Awaitable[Any]]


def shape_for(size: int, max_events: int) -> Shape:
    return Shape(
        threads=size,
        # at least a thousand: issue 22 compares claim_next at 100k pending with 1k pending
        pending=min(max(size // 10, 1000), 100_000),
        leased=min(size // 100, 10_000),
        events=min(10 * size, max_events),
        messages=min(size, 20_000),
        # the big thread's history: 10,000 checkpoints at a million threads (issue 37)
        checkpoints=min(max(size // 100, 100), 10_000),
        # issue 38: delayed dispatches (a million at a million threads) and schedules
        scheduled=size,
        schedules=min(size // 10, 100_000),
    )


def paths(shape: Shape) -> dict[str, Call]:
    middle = f"t{shape.threads // 2:08d}"

    async def claim(store: Store) -> Any:
        leases = await store.claim_next("bench-claimer", 60)
        return leases

    async def resume(store: Store) -> Any:
        # what the server's event stream routes read when a client resumes 100 events back:
        # the thread (visible_thread), the 410 probe, then the first page of the stream
        after = shape.events - 100
        await store.read(BIG)
        await store.events_after(BIG, after, 1)
        return await store.events_after(BIG, after, 100)

    return {
        "read": lambda s: s.read(middle),
        "events tail": lambda s: s.events_after(BIG, shape.events - 100, 100),
        "SSE resume": resume,
        "messages tail": lambda s: s.messages(BIG, shape.messages - 100, 100),
        "thread page, operator": lambda s: s.list_threads(limit=100),
        "thread page, tenant": lambda s: s.list_threads(tenant="tenant-3", limit=100),
        "pending page, operator": lambda s: s.list_dispatches(status="pending", limit=100),
        "dispatch page, quiet tenant": lambda s: s.list_dispatches(tenant=QUIET, limit=100),
        "dispatch page, busy tenant": lambda s: s.list_dispatches(tenant="tenant-3", limit=100),
        "one thread's done dispatches": lambda s: s.list_dispatches(
            status="done", thread_id=middle, limit=100
        ),
        "queue_depths (metrics scrape)": lambda s: s.queue_depths(limit=SCRAPE_BOUND),
        "claim_next": claim,
        "due_schedules (firing)": lambda s: s.due_schedules(),
        # time travel (issue 37): a page of the big thread's history at its head and from a
        # cursor in the middle, and one checkpoint by id
        "history page, head": lambda s: s.history(BIG, limit=50),
        "history page, middle": lambda s: s.history(
            BIG, before=f"big-c{shape.checkpoints // 2}", limit=50
        ),
        "checkpoint by id": lambda s: s.get_checkpoint(BIG, f"big-c{shape.checkpoints // 2}"),
    }


Figures = dict[str, tuple[float, float]]
"""Per path: (wall milliseconds per call, median; CPU milliseconds per call, mean)."""


class Backends:
    """The CPU time of the PostgreSQL backends serving each size's database (``/proc/<pid>/
    schedstat``, nanoseconds): what a path costs the server, which wall time on a loaded
    machine only hides under scheduling delays. Empty for SQLite (in process)."""

    def __init__(self, admin_dsn: str | None, dbnames: dict[int, str]) -> None:
        self.admin_dsn, self.dbnames = admin_dsn, dbnames
        self.pids: dict[int, list[int]] = {size: [] for size in dbnames}

    def discover(self) -> None:
        """Find the backends (after a warm-up call opened the pools' connections)."""
        if self.admin_dsn is None:
            return
        import psycopg

        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for size, name in self.dbnames.items():
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,)
                ).fetchall()
                self.pids[size] = [int(str(pid)) for (pid,) in rows]

    def ns(self, size: int) -> int:
        return sum(cpu_ns(pid) or 0 for pid in self.pids[size])


async def measure(
    urls: dict[int, str], shapes: dict[int, Shape], calls: int, backends: Backends
) -> dict[int, Figures]:
    """Wall time (median of ``calls``) and CPU time (client process plus the database's
    backends, mean of ``calls``) per call of every path, per size, on the stores at ``urls``
    (one per size, all open at once).

    The sizes take turns call by call (alternating which goes first), so that a burst of
    load from elsewhere on the machine hits every size alike: a path's ratio compares calls
    made within the same millisecond, not one size's minute against another's.
    """
    out: dict[int, Figures] = {size: {} for size in urls}
    async with contextlib.AsyncExitStack() as stack:
        stores = {
            size: await stack.enter_async_context(open_store(url)) for size, url in urls.items()
        }
        calls_of = {size: paths(shapes[size]) for size in urls}
        for name in calls_of[next(iter(urls))]:
            times: dict[int, list[float]] = {size: [] for size in urls}
            cpu: dict[int, int] = dict.fromkeys(urls, 0)
            for i in range(calls + 1):
                if i == 1:  # the first call warmed connections, statements and caches
                    backends.discover()
                order = list(urls) if i % 2 == 0 else list(reversed(urls))
                for size in order:
                    call, store = calls_of[size][name], stores[size]
                    server = backends.ns(size)
                    client = time.process_time_ns()
                    start = time.perf_counter()
                    result = await call(store)
                    took = (time.perf_counter() - start) * 1e3
                    used = time.process_time_ns() - client + backends.ns(size) - server
                    if i > 0:
                        times[size].append(took)
                        cpu[size] += used
                    if name == "claim_next":
                        await _put_back(store, result)
            for size, values in times.items():
                out[size][name] = (statistics.median(values), cpu[size] / calls / 1e6)
    return out


async def _put_back(store: Store, leases: Any) -> None:
    """Keep the queue as built: a claimed dispatch goes back to pending at its place, so
    that every call (and every round, size and statistics state) claims from the same queue
    (settling it done drained the 1k store's pending dispatches in the later rounds, which
    then timed empty claims)."""
    for lease in leases:
        await store.settle(lease.dispatch.dispatch_id, lease.claim.token, RETRY)


async def _migrated(url: str) -> None:
    async with open_store(url):
        pass


def build_sqlite(path: Path, shape: Shape) -> str:
    url = f"sqlite:///{path}"
    asyncio.run(_migrated(url))
    conn = sqlite3.connect(path)
    try:
        fill_sqlite(conn, shape)
        conn.commit()
    finally:
        conn.close()
    return url


def analyze_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("ANALYZE")
        conn.commit()
    finally:
        conn.close()


def build_postgres(db: Database, shape: Shape) -> str:
    import psycopg

    db.create()
    asyncio.run(_migrated(db.dsn))
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for table in ("threads", "dispatches", "checkpoints", "events", "messages"):
            conn.execute(f"ALTER TABLE wakeful.{table} SET (autovacuum_enabled = false)")
        with conn.transaction():
            for statement in postgres_statements('"wakeful"', shape):
                conn.execute(statement)
    return db.dsn


def analyze_postgres(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


Key = tuple[str, str, int]
"""(store, statistics state, size)."""


def _measure_all(
    found: dict[Key, list[Figures]],
    store: str,
    state: str,
    urls: dict[int, str],
    shapes: dict[int, Shape],
    args: argparse.Namespace,
    backends: Backends,
) -> None:
    for _ in range(args.rounds):
        for size, figures in asyncio.run(measure(urls, shapes, args.calls, backends)).items():
            found.setdefault((store, state, size), []).append(figures)


def _sqlite(
    args: argparse.Namespace, shapes: dict[int, Shape], found: dict[Key, list[Figures]]
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="wakeful-bench-paths-"))
    try:
        paths = {size: directory / f"paths-{size}.db" for size in shapes}
        urls = {}
        for size, shape in shapes.items():
            started = time.perf_counter()
            urls[size] = build_sqlite(paths[size], shape)
            took = time.perf_counter() - started
            print(f"sqlite {size:,}: built in {took:.1f} s", flush=True)
        local = Backends(None, dict.fromkeys(shapes, ""))
        _measure_all(found, "sqlite", "no stats", urls, shapes, args, local)
        for size, path in paths.items():
            started = time.perf_counter()
            analyze_sqlite(path)
            took = time.perf_counter() - started
            print(f"sqlite {size:,}: ANALYZE in {took:.1f} s", flush=True)
        _measure_all(found, "sqlite", "analyzed", urls, shapes, args, local)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _postgres(
    args: argparse.Namespace, shapes: dict[int, Shape], found: dict[Key, list[Figures]]
) -> None:
    dbs = {size: Database(args.dsn, f"wakeful_bench_paths_{os.getpid()}_{size}") for size in shapes}
    try:
        dsns = {}
        for size, shape in shapes.items():
            started = time.perf_counter()
            dsns[size] = build_postgres(dbs[size], shape)
            took = time.perf_counter() - started
            print(f"postgresql {size:,}: built in {took:.1f} s", flush=True)
        server = Backends(args.dsn, {size: db.name for size, db in dbs.items()})
        _measure_all(found, "postgresql", "no stats", dsns, shapes, args, server)
        for size, dsn in dsns.items():
            started = time.perf_counter()
            analyze_postgres(dsn)
            took = time.perf_counter() - started
            print(f"postgresql {size:,}: VACUUM ANALYZE in {took:.1f} s", flush=True)
        _measure_all(found, "postgresql", "analyzed", dsns, shapes, args, server)
    finally:
        for db in dbs.values():
            with contextlib.suppress(Exception):
                db.drop()


def run(args: argparse.Namespace) -> tuple[dict[Key, list[Figures]], str | None]:
    sizes = [int(x) for x in args.sizes.split(",") if x]
    shapes = {size: shape_for(size, args.max_events) for size in sizes}
    found: dict[Key, list[Figures]] = {}
    skipped: str | None = None
    stores = args.stores.split(",")
    if "sqlite" in stores:
        _sqlite(args, shapes, found)
    if "postgresql" in stores:
        try:
            _postgres(args, shapes, found)
        except Exception as exc:  # no server or no driver: SQLite still ran
            skipped = f"PostgreSQL skipped: {type(exc).__name__}: {exc}"
    return found, skipped


def _note(name: str, small: Shape, large: Shape) -> str:
    """What grew under a path besides the threads (issue 22 asks for these two)."""
    if name == "claim_next":
        return (
            f"{large.pending:,} pending vs {small.pending:,}, {large.leased:,} leased, "
            f"{large.scheduled:,} delayed vs {small.scheduled:,}"
        )
    if name.startswith("due_schedules"):
        return f"{large.schedules:,} schedules vs {small.schedules:,}"
    if name in ("events tail", "SSE resume"):
        return f"a thread of {large.events:,} events vs {small.events:,}"
    return ""


def report(
    found: dict[Key, list[Figures]],
    sizes: list[int],
    skipped: str | None,
    shapes: dict[int, Shape],
) -> list[Result]:
    """Flatness is judged on CPU time per call (the client process plus, on PostgreSQL, the
    database's backends): the work a path does, which scheduling delays on a shared machine
    do not inflate. Wall time is reported beside it with its ratio, and is what the absolute
    limits (a tenant page, a scrape) are judged on."""
    out = Collector("scale_paths")
    small, large = sizes[0], sizes[-1]
    for store, state in dict.fromkeys((k[0], k[1]) for k in found):
        names = list(found[(store, state, small)][0])
        for kind, index in (("wall ms per call, medians", 0), ("CPU ms per call", 1)):
            print(f"{store}, {state} ({kind})")
            print(f"  {'path':<32}" + "".join(f"{s:>12,}" for s in sizes) + f"{'ratio':>8}")
            for name in names:
                med = {
                    s: statistics.median(r[name][index] for r in found[(store, state, s)])
                    for s in sizes
                }
                cells = "".join(f"{med[s]:>12.3f}" for s in sizes)
                print(f"  {name:<32}{cells}{med[large] / med[small]:>7.2f}x")
        for name in names:
            wall = {s: [r[name][0] for r in found[(store, state, s)]] for s in sizes}
            cpu = {s: [r[name][1] for r in found[(store, state, s)]] for s in sizes}
            where = f"{store}, {state}, {large:,} threads"
            out.add(
                f"{name}, {where}, CPU",
                cpu[large],
                "ms",
                higher_is_better=False,
                anchor=f"the same path at {small:,} threads",
                anchor_samples=cpu[small],
                # a count grows with what it counts, up to its bound: judged absolutely
                target=None if name.startswith("queue_depths") else FLAT,
                note=_note(name, shapes[small], shapes[large]),
            )
            out.add(
                f"{name}, {where}, wall",
                wall[large],
                "ms",
                higher_is_better=False,
                anchor=f"the same path at {small:,} threads",
                anchor_samples=wall[small],
            )
            limit = {
                "dispatch page, quiet tenant": TENANT_PAGE_MS,
                "queue_depths (metrics scrape)": SCRAPE_MS,
            }.get(name)
            if limit is not None:
                out.add(
                    f"{name}, {where}, wall, absolute",
                    wall[large],
                    "ms",
                    higher_is_better=False,
                    anchor="limit (ms)",
                    anchor_samples=limit,
                    target=1.0,
                )
    if skipped:
        print(skipped)
        out.skip("paths, postgresql", "ms", skipped)
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_paths")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--sizes", default="1000,100000,1000000", help="committed threads")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per path and round")
    parser.add_argument("--max-events", type=int, default=10_000_000, help="big thread cap")
    parser.add_argument("--stores", default="sqlite,postgresql", help="which stores to measure")
    rounds_argument(parser, default=1)
    args = parser.parse_args(argv if argv is not None else [])
    found, skipped = run(args)
    sizes = [int(x) for x in args.sizes.split(",") if x]
    return report(found, sizes, skipped, {s: shape_for(s, args.max_events) for s in sizes})


if __name__ == "__main__":
    main(sys.argv[1:])
