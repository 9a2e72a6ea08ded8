"""A child process for the PostgreSQL cross-process tests.

    python -m tests.postgres_child claim <dsn> <go-file> <holder> <thread>...
    python -m tests.postgres_child drain <dsn> <go-file> <holder>
    python -m tests.postgres_child pause-drop <dsn> <go-file> <holder> <thread> <idle-timeout>

Each child opens its own store (its own pool), prints ``ready`` once open, waits until the
parent creates ``go-file`` (so that all children start together), does its part and prints
one JSON line with what it got.

``pause-drop`` (go-file unused) claims ``thread`` with a one-second lease, commits three
checkpoints, then a fourth dropping the first: inside that commit's transaction, after the
commit function ran (the thread's row is locked) and before the drop, it prints
``{"paused": <backend pid>}`` and stops itself with SIGSTOP. Once continued it prints what
the commit returned or raised.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

from wakeful.errors import ThreadBusy, WakefulError
from wakeful.records import Checkpoint, Commit, Done
from wakeful.store.postgres import PostgresStore, open_postgres_store
from wakeful.store.postgres import threads as pg_threads


async def _open(dsn: str) -> PostgresStore:
    return await open_postgres_store(dsn, pool_size=2, pool_min_size=1, migrate=False)


async def _wait_for(path: str, deadline: float = 60.0) -> None:
    limit = time.monotonic() + deadline
    while not await asyncio.to_thread(os.path.exists, path):
        if time.monotonic() > limit:
            raise SystemExit(f"no go signal at {path}")
        await asyncio.sleep(0.005)


async def claim(dsn: str, go: str, holder: str, threads: list[str]) -> list[dict[str, object]]:
    store = await _open(dsn)
    try:
        print("ready", flush=True)
        await _wait_for(go)
        won: list[dict[str, object]] = []
        for thread_id in threads:
            try:
                granted = await store.claim(thread_id, holder, 120)
            except ThreadBusy:
                continue
            won.append({"thread": thread_id, "token": granted.token})
        return won
    finally:
        await store.close()


async def drain(dsn: str, go: str, holder: str) -> list[str]:
    store = await _open(dsn)
    try:
        print("ready", flush=True)
        await _wait_for(go)
        got: list[str] = []
        idle_rounds = 0
        # Other children hold claims on threads with more work, so an empty answer is only
        # final after a few tries.
        while idle_rounds < 20:
            leases = await store.claim_next(holder, 120, limit=5)
            if not leases:
                idle_rounds += 1
                await asyncio.sleep(0.01)
                continue
            idle_rounds = 0
            for lease in leases:
                got.append(lease.dispatch.dispatch_id)
                await store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
        return got
    finally:
        await store.close()


async def pause_drop(dsn: str, holder: str, thread_id: str, idle: float) -> dict[str, object]:
    store = await open_postgres_store(
        dsn, pool_size=1, migrate=False, idle_in_transaction_timeout=idle
    )
    try:
        claim = await store.claim(thread_id, holder, 1.0)
        chain: list[Checkpoint] = []
        for i in range(4):
            chain.append(
                Checkpoint(
                    id=f"cp-{i}",
                    parent=chain[-1].id if chain else None,
                    run_id="run-1",
                    status="running",
                    state={"i": i},
                    created_at=datetime.now(UTC),
                )
            )
        for cp in chain[:3]:
            await store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        present = store._db.sql(pg_threads._PRESENT)
        execute = psycopg.AsyncConnection.execute

        async def pausing(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            if query == present:
                print(json.dumps({"paused": self.info.backend_pid}), flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            return await execute(self, query, params, **kw)

        psycopg.AsyncConnection.execute = pausing  # type: ignore[method-assign]
        try:
            receipt = await store.commit(
                thread_id,
                Commit(token=claim.token, checkpoint=chain[3], drop_checkpoints=(chain[0].id,)),
            )
        except WakefulError as exc:
            return {"error": type(exc).__name__}
        finally:
            psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign]
        return {"version": receipt.version}
    finally:
        await store.close()


def main(argv: list[str]) -> None:
    mode, dsn, go, holder, *rest = argv
    result: object
    if mode == "claim":
        result = asyncio.run(claim(dsn, go, holder, rest))
    elif mode == "drain":
        result = asyncio.run(drain(dsn, go, holder))
    elif mode == "pause-drop":
        result = asyncio.run(pause_drop(dsn, holder, rest[0], float(rest[1])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
