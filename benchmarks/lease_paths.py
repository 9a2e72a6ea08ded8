"""PostgreSQL server CPU per lease: schema version 11's set-based ``claim_next_read`` against
version 10's (``claim_next()`` one candidate at a time, then one snapshot read per lease).

Run ``python -m benchmarks.lease_paths [--dsn URL] [--rounds 40] [--limits 1,6]``. In a fresh
database (the current schema), version 10's function body is installed next to the current
one as ``claim_next_read_v10``; ``rounds`` x 2 calls per limit of pending dispatches on threads
of their own are enqueued, each thread with a checkpoint (what a snapshot reads). Then, per
round and per limit, one call of each body leases the next ``limit`` dispatches (the order
alternates round by round), each call its own transaction, as the store makes it.

Measured: the CPU time of the benchmark's one backend (``/proc/<pid>/schedstat``; the server
must run on this machine) per lease, median of the rounds. Decision 0022's third round
compares these; ``pgcost`` measures the whole drain.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from datetime import UTC, datetime

import psycopg

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument
from benchmarks.pgcost import cpu_ns
from wakeful import open_store
from wakeful.records import Checkpoint, Commit, Dispatch

PATHS = ("set", "v10")
# Version 10's claim_next_read (migration 0003's body, 0010's settings), under another name.
_V10 = """
CREATE FUNCTION wakeful.claim_next_read_v10(p_holder text, p_ttl double precision,
                                            p_limit integer)
RETURNS TABLE (o_dispatch wakeful.dispatches, o_version bigint, o_tenant text,
               o_message_count bigint, o_next_seq bigint, o_event_floor bigint,
               o_checkpoint text, o_writes text[])
LANGUAGE plpgsql SET jit = off AS $fn$
DECLARE
    d wakeful.dispatches;
BEGIN
    FOR d IN SELECT * FROM wakeful.claim_next(p_holder, p_ttl, p_limit) LOOP
        o_dispatch := d;
        SELECT t.version, t.tenant, t.message_count, t.next_seq, t.event_floor, c.body,
               ARRAY(SELECT w.body FROM wakeful.writes w WHERE w.thread_id = t.thread_id
                      ORDER BY w.version, w.idx)
          INTO o_version, o_tenant, o_message_count, o_next_seq, o_event_floor,
               o_checkpoint, o_writes
          FROM wakeful.threads t
          LEFT JOIN wakeful.checkpoints c
            ON c.thread_id = t.thread_id AND c.checkpoint_id = t.latest_checkpoint
         WHERE t.thread_id = d.thread_id;
        RETURN NEXT;
    END LOOP;
END
$fn$
"""
_CALL = "SELECT (o_dispatch).dispatch_id, o_checkpoint FROM wakeful.{}('bench', 3600, %s)"


async def _prepare(url: str, count: int) -> None:
    """``count`` pending dispatches, each on a thread with one checkpoint."""
    async with open_store(url) as store:
        for i in range(count):
            tid = f"t{i:05}"
            claim = await store.claim(tid, "setup", 60)
            checkpoint = Checkpoint(
                id=f"{tid}-c0", parent=None, run_id=tid, status="running", state={"n": 1},
                created_at=datetime.now(UTC), metadata={"graph": "noop"},
            )  # fmt: skip
            await store.commit(tid, Commit(token=claim.token, checkpoint=checkpoint))
            await store.release(tid, claim.token)
            await store.enqueue(Dispatch(dispatch_id=f"d{i:05}", thread_id=tid, kind="start"))


async def measure(url: str, rounds: int, limits: list[int]) -> dict[tuple[str, int], list[float]]:
    """Per (path, limit), backend CPU µs per lease, one value per round."""
    await _prepare(url, rounds * len(PATHS) * sum(limits))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(_V10)
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None
        pid = int(row[0])
        if cpu_ns(pid) is None:
            raise SystemExit("the server is not on this machine: no backend CPU to read")
        queries = {
            "set": _CALL.format("claim_next_read"),
            "v10": _CALL.format("claim_next_read_v10"),
        }
        used: dict[tuple[str, int], list[float]] = {(p, k): [] for p in PATHS for k in limits}
        for r in range(rounds):
            for k in limits:
                for path in PATHS if r % 2 == 0 else PATHS[::-1]:
                    before = cpu_ns(pid) or 0
                    rows = await (await conn.execute(queries[path], (k,))).fetchall()
                    spent = (cpu_ns(pid) or 0) - before
                    if len(rows) != k or any(body is None for _, body in rows):
                        raise RuntimeError(f"{path}: {len(rows)} leases of {k}: {rows}")
                    used[(path, k)].append(spent / k / 1000)
    return used


def run(args: argparse.Namespace) -> list[Result]:
    limits = [int(k) for k in args.limits.split(",")]
    db = Database(args.dsn, f"wakeful_bench_leases_{os.getpid()}")
    db.create()
    try:
        used = asyncio.run(measure(db.dsn, args.rounds, limits))
    finally:
        db.drop()
    out = Collector("lease_paths")
    print(f"lease_paths: backend CPU per lease, {args.rounds} rounds")
    for k in limits:
        out.add(
            f"PostgreSQL server CPU per lease, set-based claim_next_read vs version 10's, "
            f"calls of {k}",
            used[("set", k)],
            "us",
            higher_is_better=False,
            anchor="version 10",
            anchor_samples=used[("v10", k)],
        )
        for path in PATHS:
            values = used[(path, k)]
            q = statistics.quantiles(values, n=4)
            print(f"  limit {k:>3} {path:<4} {statistics.median(values):6,.0f} us "
                  f"(quartiles {q[0]:,.0f}-{q[2]:,.0f})")  # fmt: skip
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lease_paths")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--limits", default="1,6", help="leases per call, comma-separated")
    rounds_argument(parser, default=40)
    return run(parser.parse_args(argv if argv is not None else []))


if __name__ == "__main__":
    main(sys.argv[1:])
