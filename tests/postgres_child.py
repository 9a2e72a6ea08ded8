"""A child process for the PostgreSQL cross-process tests.

    python -m tests.postgres_child claim <dsn> <go-file> <holder> <thread>...
    python -m tests.postgres_child drain <dsn> <go-file> <holder>

Each child opens its own store (its own pool), prints ``ready`` once open, waits until the
parent creates ``go-file`` (so that all children start together), does its part and prints
one JSON line with what it got.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from wakeful.errors import ThreadBusy
from wakeful.records import Done
from wakeful.store.postgres import PostgresStore, open_postgres_store


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


def main(argv: list[str]) -> None:
    mode, dsn, go, holder, *rest = argv
    result: object
    if mode == "claim":
        result = asyncio.run(claim(dsn, go, holder, rest))
    elif mode == "drain":
        result = asyncio.run(drain(dsn, go, holder))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
