"""Time on PostgreSQL (issue 38, item 4): what delayed dispatches cost ``claim_next``, and
how fast one firer fires schedules that are all due at once.

Run ``python -m benchmarks.delayed_claims [--delayed 0,100000,1000000] [--ready 200]
[--schedules 1000] [--calls 50] [--dsn URL]``.

1. ``claim_next`` with N delayed dispatches ahead of the ready ones: for each N a fresh
   database holds N dispatches due in a day (each on a thread of its own, enqueued first)
   and ``--ready`` due ones behind them; the figure is the median ``claim_next`` call (each
   lease is put back with a zero-delay retry so every call claims from the same queue).
   The delayed rows are stored as the schema stores them: ``scheduled`` (migration 0019,
   outside the claim's index; the claim's due step probes their own index once), or, on a
   schema before it, ``pending`` at the head of the pending index, which every claim walked
   past (the figures of docs/benchmarks.md before and after).
2. ``fire_due``: ``--schedules`` interval schedules all due at the same moment, fired by one
   firer; the time to fire them all and per schedule (a tick costs a read of its id, an
   enqueue and a compare-and-set: three round trips).

Data for part 1 is written with one ``INSERT ... SELECT`` (the public API would take minutes
for a million); the schedules of part 2 through the API.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid

import msgspec

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result
from benchmarks.pgcost import cpu_ns
from wakeful import open_store
from wakeful.fleet.schedules import fire_due, schedule
from wakeful.records import Retry

SCHEMA = "wakeful"
PAYLOAD = '{"target":"echo","input":null,"run_id":"RUN","tenant":null}'


def _fill(dsn: str, delayed: int, ready: int) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        check = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'dispatches_status_check'"
        ).fetchone()
        later = "scheduled" if check is not None and "scheduled" in check[0] else "pending"
        for prefix, count, due, status in (
            ("dd", delayed, "now() + interval '1 day'", later),
            ("dr", ready, "now()", "pending"),
        ):
            if count == 0:
                continue
            conn.execute(
                f"""INSERT INTO {SCHEMA}.threads (thread_id, present)
                    SELECT '{prefix}t' || i, true FROM generate_series(1, {count}) i"""
            )
            conn.execute(
                f"""INSERT INTO {SCHEMA}.dispatches (dispatch_id, thread_id, kind, payload,
                        priority, available_at, max_attempts, status, attempts, created_at,
                        updated_at)
                    SELECT '{prefix}-' || i, '{prefix}t' || i, 'start',
                           replace('{PAYLOAD}', 'RUN', 'run-{prefix}-' || i), 0, {due}, 5,
                           '{status}', 0, now(), now()
                      FROM generate_series(1, {count}) i"""
            )
        conn.execute(f"ANALYZE {SCHEMA}.dispatches")
        conn.execute(f"ANALYZE {SCHEMA}.threads")


def _backends(admin_dsn: str, dbname: str) -> list[int]:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (dbname,)
        ).fetchall()
    return [int(pid) for (pid,) in rows]


async def _claims(db: Database, calls: int) -> tuple[list[float], list[float]]:
    """Wall milliseconds of each ``claim_next`` call, and the server CPU (microseconds, the
    database's backends: what a loaded machine's scheduling delays do not inflate)."""
    async with open_store(db.dsn) as store:
        times, cpu = [], []
        pids: list[int] = []
        for i in range(calls + 1):
            if i == 1:  # the first call opened the pool's connections and warmed caches
                pids = _backends(db.admin_dsn, db.name)
            before = sum(cpu_ns(pid) or 0 for pid in pids)
            start = time.perf_counter()
            leases = await store.claim_next("bench", 60)
            took = (time.perf_counter() - start) * 1e3
            used = (sum(cpu_ns(pid) or 0 for pid in pids) - before) / 1e3
            if i > 0:
                times.append(took)
                cpu.append(used)
            assert len(leases) == 1 and leases[0].dispatch.dispatch_id.startswith("dr-")
            lease = leases[0]
            await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Retry(0.0))
        return times, cpu


async def _firing(dsn: str, count: int) -> tuple[float, int]:
    async with open_store(dsn) as store:
        for i in range(count):
            await schedule(store, f"s{i:05d}", target="echo", every=60, thread=f"st{i}")
        # make every one due now: one moment for all (what 10k schedules at 09:00 are)
        now = await store.store_now()
        minute = now.replace(second=0, microsecond=0)  # a tick of every one of them
        for s in await store.list_schedules(limit=count):
            due = msgspec.structs.replace(s, next_fire_at=minute)
            await store.put_schedule(due, s.revision)
        start = time.perf_counter()
        fired = 0
        while fired < count:
            batch = await fire_due(store, limit=100)
            if not batch:
                break
            fired += len(batch)
        return time.perf_counter() - start, fired


def run(args: argparse.Namespace) -> list[Result]:
    out = Collector("delayed_claims")
    sizes = [int(x) for x in args.delayed.split(",") if x]
    for n in sizes:
        db = Database(args.dsn, f"wakeful_bench_delayed_{uuid.uuid4().hex[:8]}").create()
        try:
            asyncio.run(_migrate(db.dsn))
            started = time.perf_counter()
            _fill(db.dsn, n, args.ready)
            built = time.perf_counter() - started
            times, cpu = asyncio.run(_claims(db, args.calls))
            out.add(
                f"claim_next, {n:,} delayed ahead",
                times,
                "ms",
                higher_is_better=False,
                note=f"median of {args.calls} calls; data built in {built:.1f} s",
            )
            out.add(
                f"claim_next, {n:,} delayed ahead, server CPU",
                cpu,
                "us",
                higher_is_better=False,
                note="the database's backends during the call",
            )
            print(
                f"claim_next with {n:>9,} delayed ahead: median {statistics.median(times):.2f} ms"
                f" (p90 {sorted(times)[int(len(times) * 0.9) - 1]:.2f} ms), server CPU median "
                f"{statistics.median(cpu):,.0f} us",
                flush=True,
            )
        finally:
            db.drop()
    if args.schedules:
        db = Database(args.dsn, f"wakeful_bench_fire_{uuid.uuid4().hex[:8]}").create()
        try:
            asyncio.run(_migrate(db.dsn))
            seconds, fired = asyncio.run(_firing(db.dsn, args.schedules))
            out.add(
                f"fire_due, {fired:,} due at once, one firer", seconds, "s", higher_is_better=False
            )
            out.add(
                "fire_due, per schedule",
                seconds / max(fired, 1) * 1e3,
                "ms",
                higher_is_better=False,
            )
            print(
                f"fire_due: {fired:,} schedules due at once fired in {seconds:.2f} s by one "
                f"firer ({seconds / max(fired, 1) * 1e3:.2f} ms each)",
                flush=True,
            )
        finally:
            db.drop()
    return out.results


async def _migrate(dsn: str) -> None:
    async with open_store(dsn):
        pass


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.delayed_claims")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--delayed", default="0,100000,1000000", help="delayed dispatches")
    parser.add_argument("--ready", type=int, default=200, help="due dispatches behind them")
    parser.add_argument("--schedules", type=int, default=1000, help="schedules due at once")
    parser.add_argument("--calls", type=int, default=50, help="timed claim_next calls")
    args = parser.parse_args(argv if argv is not None else [])
    return run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
