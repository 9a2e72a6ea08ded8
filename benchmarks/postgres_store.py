"""Benchmark: the PostgreSQL store beside a raw one-row INSERT and LangGraph's PostgresSaver,
on the same server and database, in one run.

Run ``python -m benchmarks.postgres_store [--dsn URL] [--n 2000] [--rounds 3]``. ``--dsn``
names a database the benchmark may create another database from (default: the local
server's ``postgres`` database as ``postgres``); the benchmark works in a fresh database
``wakeful_bench_<pid>`` and drops it at the end. Interleaved round by round (medians
reported, since a VM's fsync latency swings):

- raw: autocommit ``INSERT`` of one row holding the same JSON a commit stores, per second,
  from one client and from 16 (the server's floor for a durable one-row transaction);
- wakeful commits/s: a commit is what one runtime superstep writes: a new checkpoint of
  ~1.5 kB state, one event and an operation id, fenced by the claim token; sequential and
  from 16 concurrent clients (16 tasks on one store, each on its own thread);
- wakeful ``claim_next`` + ``settle(Done)`` cycles/s over pending dispatches, sequential and
  16 concurrent;
- LangGraph ``PostgresSaver.put`` of the same state per second, sequential and from 16 OS
  threads, and ``AsyncPostgresSaver.aput`` from 16 tasks (skipped, saying so, when
  ``langgraph-checkpoint-postgres`` is not installed).

Everything runs with the server's defaults (``synchronous_commit=on``): every acknowledged
operation is durable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, cast

import psycopg
import psycopg_pool
from psycopg import sql

from benchmarks.common import Collector, Result, bench_checkpoint, payload
from wakeful.records import Commit, Dispatch, Done, EventDraft
from wakeful.store.postgres import PostgresStore, open_postgres_store
from wakeful.store.postgres.codec import text

CLIENTS = 16
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


async def _commits(store: PostgresStore, count: int, state: dict[str, Any], w: int) -> None:
    thread_id = f"commit-{uuid.uuid4().hex[:8]}-{w}"
    claim = await store.claim(thread_id, "bench", 3600)
    parent = None
    for i in range(count):
        cp = bench_checkpoint(parent, state)
        commit = Commit(
            token=claim.token,
            checkpoint=cp,
            events=(EventDraft(type="step", data={"i": i}),),
            operation_id=f"bench:{i}",
        )
        await store.commit(thread_id, commit)
        parent = cp.id


async def _cycles(store: PostgresStore, count: int, w: int) -> None:
    done = empty = 0
    while done < count:
        leases = await store.claim_next(f"worker-{w}", 60)
        if not leases:
            # every remaining candidate is locked by another claimer this instant
            empty += 1
            if empty > 1000:
                raise RuntimeError("the benchmark ran out of dispatches")
            await asyncio.sleep(0)
            continue
        await store.settle(leases[0].dispatch.dispatch_id, leases[0].claim.token, Done())
        done += 1


async def _enqueue(store: PostgresStore, n: int) -> None:
    """``n`` pending dispatches for the claim cycles (setup, not timed: 16 at a time)."""
    gate = asyncio.Semaphore(CLIENTS)

    async def one(i: int) -> None:
        async with gate:
            await store.enqueue(
                Dispatch(
                    dispatch_id=uuid.uuid4().hex,
                    thread_id=f"q-{uuid.uuid4().hex}",
                    kind="start",
                    payload={"i": i},
                )
            )

    await asyncio.gather(*(one(i) for i in range(n)))


async def _raw_client(
    pool: psycopg_pool.AsyncConnectionPool[Any], count: int, body: str, w: int
) -> None:
    async with pool.connection() as conn:
        for _ in range(count):
            await conn.execute("INSERT INTO bench_raw (body) VALUES (%s)", (body,))


async def _timed(work: Callable[[int], Awaitable[None]], n: int, k: int) -> float:
    """Operations per second for ``k`` concurrent clients doing ``n`` in total."""
    start = time.perf_counter()
    await asyncio.gather(*(work(w) for w in range(k)))
    return (n // k) * k / (time.perf_counter() - start)


async def wakeful_and_raw_rates(dsn: str, n: int) -> dict[str, float]:
    state = payload()
    body = text(bench_checkpoint(None, state))
    rates: dict[str, float] = {}
    pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
        dsn, min_size=CLIENTS, max_size=CLIENTS, open=False, kwargs={"autocommit": True}
    )
    await pool.open(wait=True)
    store = await open_postgres_store(dsn, pool_size=CLIENTS)
    try:
        for k in (1, CLIENTS):
            per = n // k
            rates[f"raw x{k}"] = await _timed(partial(_raw_client, pool, per, body), n, k)
            rates[f"commit x{k}"] = await _timed(partial(_commits, store, per, state), n, k)
            await _enqueue(store, n)
            rates[f"cycle x{k}"] = await _timed(partial(_cycles, store, per), n, k)
    finally:
        await store.close()
        await pool.close()
    return rates


def langgraph_rates(dsn: str, n: int) -> tuple[dict[str, float], str]:
    try:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:
        return {}, "langgraph-checkpoint-postgres is not installed: LangGraph column skipped"
    state = payload()
    rates: dict[str, float] = {}

    def put_many(saver: Any, w: int, count: int) -> None:
        config: Any = {"configurable": {"thread_id": f"lg-{uuid.uuid4().hex}", "checkpoint_ns": ""}}
        for step in range(count):
            checkpoint: Any = empty_checkpoint()
            checkpoint["id"] = str(uuid.uuid4())
            checkpoint["channel_values"] = dict(state)
            versions = {channel: step + 1 for channel in state}
            checkpoint["channel_versions"] = versions
            config = saver.put(config, checkpoint, {"source": "loop", "step": step}, versions)

    with psycopg_pool.ConnectionPool(
        dsn,
        min_size=CLIENTS,
        max_size=CLIENTS,
        open=True,
        kwargs={"autocommit": True, "prepare_threshold": 0},
    ) as pool:
        saver = PostgresSaver(cast(Any, pool))
        saver.setup()
        for k in (1, CLIENTS):
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=k) as threads:
                for future in [threads.submit(put_many, saver, w, n // k) for w in range(k)]:
                    future.result()
            rates[f"put x{k}"] = (n // k) * k / (time.perf_counter() - start)
    return rates, "PostgresSaver: psycopg pool of 16 autocommit connections, one per thread"


async def langgraph_async_rates(dsn: str, n: int) -> dict[str, float]:
    try:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError:
        return {}
    state = payload()

    async def put_many(saver: Any, count: int) -> None:
        config: Any = {"configurable": {"thread_id": f"lg-{uuid.uuid4().hex}", "checkpoint_ns": ""}}
        for step in range(count):
            checkpoint: Any = empty_checkpoint()
            checkpoint["id"] = str(uuid.uuid4())
            checkpoint["channel_values"] = dict(state)
            versions = {channel: step + 1 for channel in state}
            checkpoint["channel_versions"] = versions
            config = await saver.aput(
                config, checkpoint, {"source": "loop", "step": step}, versions
            )

    pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
        dsn,
        min_size=CLIENTS,
        max_size=CLIENTS,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0},
    )
    await pool.open(wait=True)
    try:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        start = time.perf_counter()
        await asyncio.gather(*(put_many(saver, n // CLIENTS) for _ in range(CLIENTS)))
        return {f"aput x{CLIENTS}": (n // CLIENTS) * CLIENTS / (time.perf_counter() - start)}
    finally:
        await pool.close()


def _bench_database(admin_dsn: str) -> tuple[str, str]:
    name = f"wakeful_bench_{os.getpid()}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_raw (id bigserial PRIMARY KEY, body text NOT NULL)")
    return name, dsn


def _drop(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def results(samples: dict[str, list[float]], skipped: str | None) -> list[Result]:
    out = Collector("postgres_store")
    out.add("raw one-row INSERT, 1 client", samples["raw x1"], "/s")
    out.add(f"raw one-row INSERT, {CLIENTS} clients", samples[f"raw x{CLIENTS}"], "/s")
    # Issue 22 restated the sequential target as >= 0.6x the raw INSERT and left the one
    # against PostgresSaver (>= 3x, bounded near 1x by decision 0005) a figure.
    for k, target_raw, target_lg in ((1, 0.6, None), (CLIENTS, None, None)):
        label = "commit, sequential" if k == 1 else f"commit, {CLIENTS} concurrent"
        clients = "1 client" if k == 1 else f"{CLIENTS} clients"
        threads = "1 thread" if k == 1 else f"{CLIENTS} threads"
        out.add(
            f"{label} (vs raw INSERT)",
            samples[f"commit x{k}"],
            "/s",
            anchor=f"raw one-row INSERT, {clients}",
            anchor_samples=samples[f"raw x{k}"],
            target=target_raw,
        )
        out.add(
            f"{label} (vs LangGraph)",
            samples[f"commit x{k}"],
            "/s",
            anchor=f"LangGraph PostgresSaver.put, {threads}",
            anchor_samples=samples.get(f"put x{k}"),
            target=target_lg,
            skipped=skipped,
        )
    out.add("claim_next + settle, sequential", samples["cycle x1"], "/s")
    out.add(f"claim_next + settle, {CLIENTS} concurrent", samples[f"cycle x{CLIENTS}"], "/s")
    for key, label in (
        ("put x1", "LangGraph PostgresSaver.put, 1 thread"),
        (f"put x{CLIENTS}", f"LangGraph PostgresSaver.put, {CLIENTS} threads"),
        (f"aput x{CLIENTS}", f"LangGraph AsyncPostgresSaver.aput, {CLIENTS} tasks"),
    ):
        if key in samples:
            out.add(label, samples[key], "/s")
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--n", type=int, default=2000, help="operations per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    args = parser.parse_args(argv if argv is not None else [])
    name, dsn = _bench_database(args.dsn)
    samples: dict[str, list[float]] = {}
    note = ""
    try:
        for _ in range(args.rounds):
            rates = asyncio.run(wakeful_and_raw_rates(dsn, args.n))
            theirs, note = langgraph_rates(dsn, args.n)
            rates.update(theirs)
            rates.update(asyncio.run(langgraph_async_rates(dsn, args.n)))
            for key, rate in rates.items():
                samples.setdefault(key, []).append(rate)
        with psycopg.connect(dsn) as conn:
            settings = conn.execute(
                "SELECT current_setting('server_version'), current_setting('synchronous_commit')"
            ).fetchone()
    finally:
        _drop(args.dsn, name)
    med = {key: statistics.median(values) for key, values in samples.items()}
    assert settings is not None
    print(
        f"PostgreSQL {settings[0]}, synchronous_commit={settings[1]}; "
        f"operations per measurement: {args.n}; rounds: {args.rounds}; medians"
    )
    print(f"{'measurement':<50}{'per second':>12}{'vs raw':>9}{'vs LangGraph':>14}")
    rows: list[tuple[str, str, str | None, str | None]] = [
        ("raw one-row INSERT, 1 client", "raw x1", None, None),
        (f"raw one-row INSERT, {CLIENTS} clients", f"raw x{CLIENTS}", None, None),
        ("wakeful commit, sequential", "commit x1", "raw x1", "put x1"),
        (f"wakeful commit, {CLIENTS} concurrent", f"commit x{CLIENTS}", f"raw x{CLIENTS}",
         f"put x{CLIENTS}"),
        ("wakeful claim_next + settle, sequential", "cycle x1", None, None),
        (f"wakeful claim_next + settle, {CLIENTS} concurrent", f"cycle x{CLIENTS}", None, None),
        ("LangGraph PostgresSaver.put, 1 thread", "put x1", None, None),
        (f"LangGraph PostgresSaver.put, {CLIENTS} threads", f"put x{CLIENTS}", None, None),
        (f"LangGraph AsyncPostgresSaver.aput, {CLIENTS} tasks", f"aput x{CLIENTS}", None, None),
    ]  # fmt: skip
    for label, key, raw_key, their_key in rows:
        if key not in med:
            continue
        vs_raw = f"{med[key] / med[raw_key]:.2f}x" if raw_key in med else ""
        vs_lg = f"{med[key] / med[their_key]:.2f}x" if their_key in med else ""
        print(f"{label:<50}{med[key]:>12,.0f}{vs_raw:>9}{vs_lg:>14}")
    print(note)
    return results(samples, None if "put x1" in samples else note)


if __name__ == "__main__":
    main(sys.argv[1:])
