"""Client CPU per PostgreSQL round trip: ``SELECT 1`` through the store's ``Database`` and
through the driver alone.

Run ``python -m benchmarks.roundtrip_cpu [--n 5000] [--rounds 5] [--dsn URL]``. Each round
times ``--n`` sequential ``SELECT 1`` (after 200 untimed) on each path, in turn, and prints
process CPU (user + system, ``getrusage``) per round trip; the last line gives each path's
median over the rounds. The paths:

- ``database``: ``Database.fetchone``, as every store call runs (pool checkout, the call,
  the return, the error translation);
- ``pool``: ``pool.connection()`` then the statement, on the store's pool;
- ``psycopg``: psycopg's plain ``AsyncConnection``, one connection, no pool;
- ``sync``: psycopg's blocking ``Connection`` (no event loop: the floor).

Decision 0022, seventh session (h22p). Only ``Database`` is the store's own; run it with
``PYTHONPATH=<other checkout>/src:<other checkout>`` to compare two versions of the source.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from benchmarks.common import DEFAULT_DSN
from wakeful.store.postgres.connection import Database

WARMUP = 200


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _timed(call: Callable[[], Awaitable[Any]], n: int) -> float:
    for _ in range(WARMUP):
        await call()
    started = _cpu()
    for _ in range(n):
        await call()
    return (_cpu() - started) / n * 1e6


def _sync(dsn: str, n: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(WARMUP):
            conn.execute("SELECT 1").fetchone()
        started = _cpu()
        for _ in range(n):
            conn.execute("SELECT 1").fetchone()
        return (_cpu() - started) / n * 1e6


async def _connection(cls: type[psycopg.AsyncConnection[Any]], dsn: str, n: int) -> float:
    conn = await cls.connect(dsn, autocommit=True)
    try:

        async def call() -> Any:
            cur = await conn.execute("SELECT 1")
            return await cur.fetchone()

        return await _timed(call, n)
    finally:
        await conn.close()


async def one_round(dsn: str, n: int) -> dict[str, float]:
    """Process CPU µs per round trip, per path."""
    found: dict[str, float] = {}
    db = await Database.connect(
        dsn, schema="wakeful", pool=None, pool_size=4, pool_min_size=None, timeout=10
    )
    try:
        found["database"] = await _timed(lambda: db.fetchone("SELECT 1", None), n)

        async def pooled() -> Any:
            async with db.pool.connection() as conn:
                cur = await conn.execute("SELECT 1")
                return await cur.fetchone()

        found["pool"] = await _timed(pooled, n)
    finally:
        await db.close()
    found["psycopg"] = await _connection(psycopg.AsyncConnection, dsn, n)
    found["sync"] = _sync(dsn, n)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    args = parser.parse_args(argv)
    rounds: dict[str, list[float]] = {}
    for i in range(args.rounds):
        found = asyncio.run(one_round(args.dsn, args.n))
        for path, value in found.items():
            rounds.setdefault(path, []).append(value)
        print(f"round {i}: " + ", ".join(f"{p} {v:.1f}" for p, v in found.items()), flush=True)
    medians = ", ".join(f"{p} {statistics.median(v):.1f}" for p, v in rounds.items())
    print(f"median µs of CPU per round trip: {medians}")


if __name__ == "__main__":
    main()
