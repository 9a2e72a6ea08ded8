"""A child process for the SQLite cross-process tests. Run from the repository root as
``python -m tests.sqlite_child COMMAND URL ...``; it reports JSON lines on stdout, each
printed only after the operation it reports has returned.

Commands:
  race URL HOLDER GO N     wait for file GO, then try to claim threads race-0..race-N-1
  drain URL HOLDER GO      wait for file GO, then claim_next until nothing is available
  commit URL N             claim threads crash-0..crash-N-1, then commit forever
  wait URL THREAD AFTER    wait_events(THREAD, AFTER, timeout=60)
  hold URL THREAD TTL GO   claim THREAD for TTL s and commit once (reports ``holding``), sit
                           idle (no transaction open) until file GO exists, then commit
                           again with the same token (reports ``committed`` or ``stale``)
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from datetime import UTC, datetime
from typing import Any

from wakeful.errors import StaleClaim, ThreadBusy
from wakeful.records import Checkpoint, Commit, EventDraft, Message
from wakeful.store import open_store


def report(kind: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"kind": kind, **fields}) + "\n")
    sys.stdout.flush()


def wait_for_file(path: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"no go signal at {path}")
        time.sleep(0.001)


async def race(url: str, holder: str, go: str, count: int) -> None:
    async with open_store(url) as store:
        names = [f"race-{i}" for i in range(count)]
        random.shuffle(names)
        report("ready")
        wait_for_file(go)
        won: dict[str, int] = {}
        busy: dict[str, str | None] = {}
        for name in names:
            try:
                won[name] = (await store.claim(name, holder, 600)).token
            except ThreadBusy as refused:
                busy[name] = refused.holder
        report("result", won=won, busy=busy)


async def drain(url: str, holder: str, go: str) -> None:
    async with open_store(url) as store:
        report("ready")
        wait_for_file(go)
        leased: list[list[Any]] = []
        while leases := await store.claim_next(holder, 600, limit=random.randint(1, 3)):
            leased += [[lease.dispatch.dispatch_id, lease.claim.token] for lease in leases]
        report("result", leased=leased)


async def commit_forever(url: str, count: int) -> None:
    async with open_store(url) as store:
        names = [f"crash-{i}" for i in range(count)]
        tokens = {name: (await store.claim(name, "child", 60)).token for name in names}
        latest: dict[str, str | None] = dict.fromkeys(names)
        report("claimed", tokens=tokens)
        i = 0
        while True:
            name = names[i % count]
            checkpoint = Checkpoint(
                id=f"cp-{i}",
                parent=latest[name],
                run_id="run-child",
                status="running",
                state={"i": i, "pad": "x" * random.randint(0, 3000)},
                created_at=datetime.now(UTC),
            )
            receipt = await store.commit(
                name,
                Commit(
                    token=tokens[name],
                    checkpoint=checkpoint,
                    events=(EventDraft(type="step", data={"i": i}),),
                    messages=(Message(id=f"m-{i}", role="assistant", content=str(i)),),
                ),
            )
            latest[name] = checkpoint.id
            report("ack", thread=name, i=i, version=receipt.version, seq=receipt.events[0])
            i += 1


async def wait(url: str, thread: str, after: int) -> None:
    async with open_store(url) as store:
        await store.events_after(thread, after)
        report("ready")
        events = await store.wait_events(thread, after, timeout=60)
        report("woke", seqs=[e.seq for e in events], at=time.time())


async def hold(url: str, thread: str, ttl: float, go: str) -> None:
    async with open_store(url) as store:
        claim = await store.claim(thread, "paused", ttl)
        await store.commit(thread, Commit(token=claim.token, events=(EventDraft(type="a"),)))
        report("holding", token=claim.token, expires=claim.expires_at.isoformat())
        await asyncio.to_thread(wait_for_file, go)  # idle between commits: paused here
        try:
            await store.commit(thread, Commit(token=claim.token, events=(EventDraft(type="b"),)))
        except StaleClaim as refused:
            report("stale", current=refused.current)
        else:
            report("committed")


def main(argv: list[str]) -> None:
    command, url, *rest = argv
    if command == "race":
        asyncio.run(race(url, rest[0], rest[1], int(rest[2])))
    elif command == "drain":
        asyncio.run(drain(url, rest[0], rest[1]))
    elif command == "commit":
        asyncio.run(commit_forever(url, int(rest[0])))
    elif command == "hold":
        asyncio.run(hold(url, rest[0], float(rest[1]), rest[2]))
    elif command == "wait":
        asyncio.run(wait(url, rest[0], int(rest[1])))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
