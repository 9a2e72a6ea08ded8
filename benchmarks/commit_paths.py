"""PostgreSQL server CPU per commit on each path a dispatch's commits can take.

Run ``python -m benchmarks.commit_paths [--dsn URL] [--rounds 40] [--batch 6]``. In a fresh
database, ``rounds`` x 3 batches of ``batch`` leased dispatches on threads of their own; for
each, a dispatch's two commits (admission: a checkpoint, one event, an operation id; final:
a checkpoint, two events, an operation id and ``settle(Done)``) are sent, one batch at a
time and interleaved round by round, as:

- ``set``: one ``commit_many`` call (migration 0009: the set-based path);
- ``each``: one ``commit_each`` call (version 6's ``commit_many``: ``commit()`` per commit, in
  a subtransaction each);
- ``single``: one ``commit()`` call per commit, each its own transaction.

Measured: the CPU time of the benchmark's one backend (``/proc/<pid>/schedstat``; the server
must run on this machine) per commit, median of the rounds. This is what decision 0022's
second round compares; ``pgcost`` measures the whole drain.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from datetime import UTC, datetime
from typing import Any

import psycopg

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument
from benchmarks.pgcost import cpu_ns
from wakeful import open_store
from wakeful.records import Checkpoint, Commit, Dispatch, Done, EventDraft, Settle
from wakeful.store.postgres.connection import render
from wakeful.store.postgres.group import COMMIT_MANY, batch_params
from wakeful.store.postgres.threads import COMMIT, _commit_params
from wakeful.store.validate import encode_commit

PATHS = ("set", "each", "single")
Params = tuple[object, ...]


def _commit(thread: str, token: int, dispatch: str, final: bool) -> Params:
    cid = f"{thread}-c{int(final)}"
    checkpoint = Checkpoint(
        id=cid,
        parent=f"{thread}-c0" if final else None,
        run_id=thread,
        status="completed" if final else "running",
        state={"n": 1},
        created_at=datetime.now(UTC),
        metadata={"graph": "noop"},
    )
    events = ("task.done", "run.completed") if final else ("run.started",)
    commit = Commit(
        token=token,
        checkpoint=checkpoint,
        events=tuple(EventDraft(type=e) for e in events),
        operation_id=cid,
        settle=Settle(dispatch_id=dispatch, outcome=Done()) if final else None,
    )
    return (thread, token, *_commit_params(encode_commit(thread, commit)))


async def _leases(url: str, count: int) -> list[tuple[str, int, str]]:
    """(thread, token, dispatch) of ``count`` leased dispatches."""
    async with open_store(url) as store:
        for i in range(count):
            tid = f"{i:05}"
            await store.enqueue(Dispatch(dispatch_id=f"d{tid}", thread_id=f"t{tid}", kind="start"))
        leases: list[tuple[str, int, str]] = []
        while found := await store.claim_next("bench", 3600, 1000):
            for x in found:
                leases.append((x.dispatch.thread_id, x.claim.token, x.dispatch.dispatch_id))
    return sorted(leases)


async def measure(url: str, rounds: int, batch: int) -> dict[str, list[float]]:
    """Per path, backend CPU µs per commit, one value per round."""
    leases = await _leases(url, rounds * len(PATHS) * batch)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None
        pid = int(row[0])
        if cpu_ns(pid) is None:
            raise SystemExit("the server is not on this machine: no backend CPU to read")
        many = render(COMMIT_MANY, conn, "wakeful")
        queries = {"set": many, "each": many.replace(".commit_many(", ".commit_each(")}
        single = render(COMMIT, conn, "wakeful")
        used: dict[str, list[float]] = {path: [] for path in PATHS}
        for r in range(rounds):
            order = PATHS if r % 2 == 0 else PATHS[::-1]
            for n, path in enumerate(order):
                group = leases[(r * len(PATHS) + n) * batch :][:batch]
                spent = 0
                for final in (False, True):
                    params = [_commit(t, token, d, final) for t, token, d in group]
                    before = cpu_ns(pid) or 0
                    if path == "single":
                        for p in params:
                            await (await conn.execute(single, p)).fetchone()
                    else:
                        async with conn.transaction():
                            cur = await conn.execute(queries[path], batch_params(params))
                            rows: list[Any] = await cur.fetchall()
                        if any(row[5] is not None for row in rows):
                            raise RuntimeError(f"{path}: a commit was refused: {rows}")
                    spent += (cpu_ns(pid) or 0) - before
                used[path].append(spent / (2 * batch) / 1000)
    return used


def run(args: argparse.Namespace) -> list[Result]:
    db = Database(args.dsn, f"wakeful_bench_commits_{os.getpid()}")
    db.create()
    try:
        used = asyncio.run(measure(db.dsn, args.rounds, args.batch))
    finally:
        db.drop()
    out = Collector("commit_paths")
    names = {
        "set": "commit_many (set-based)",
        "each": "commit_each (a subtransaction per commit)",
        "single": "commit() alone",
    }
    for path in ("each", "single"):
        out.add(
            f"PostgreSQL server CPU per commit, {names['set']} vs {names[path]}, batches of "
            f"{args.batch}",
            used["set"],
            "us",
            higher_is_better=False,
            anchor=names[path],
            anchor_samples=used[path],
        )
    print(f"commit_paths: backend CPU per commit, {args.rounds} rounds, batches of {args.batch}")
    for path in PATHS:
        q = statistics.quantiles(used[path], n=4)
        print(f"  {names[path]:<42} {statistics.median(used[path]):6,.0f} us "
              f"(quartiles {q[0]:,.0f}-{q[2]:,.0f})")  # fmt: skip
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.commit_paths")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--batch", type=int, default=6, help="commits per batch")
    rounds_argument(parser, default=40)
    return run(parser.parse_args(argv if argv is not None else []))


if __name__ == "__main__":
    main(sys.argv[1:])
