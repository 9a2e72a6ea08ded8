"""What one run of ``benchmarks.concurrency`` costs in store calls and SQL statements, a
figure that does not depend on the machine's load (issue 24, part 2).

The same experiment as ``benchmarks.concurrency`` (one worker, N runs each streaming a
600-character reply as 150 deltas, ``ClaimPolicy(ttl=30, renew_every=10)``), with every call
of the store's public methods counted by name (``commit``, ``messages``,
``stream_checkpoints.get`` ...) and, on PostgreSQL, every SQL statement the driver sent,
named by the schema function or table it calls. Printed per run (divided by N). Stream
checkpoint puts depend on the stream's length (one every ``checkpoint_every_seconds``):
they are reported apart from the fixed per-run calls.

    python -m benchmarks.concurrency_count --n 200 --seconds 18.1
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Database
from benchmarks.concurrency import Paced, _ended

_STORE_CALLS = (
    "claim_next",
    "claim",
    "renew",
    "release",
    "commit",
    "claim_and_commit",
    "read",
    "messages",
    "settle",
    "inbox",
    "heartbeat",
)
_CHECKPOINT_CALLS = ("get", "put", "delete", "discard")
_NAME = re.compile(r'"?\w+"?\.(\w+)\s*\(|\bFROM\s+"?\w+"?\.(\w+)|\b(DELETE|UPDATE|INSERT)\b', re.I)


def _count_store(store: Any, counts: collections.Counter[str]) -> None:
    """Count the calls of the store's public methods (patched on the instance)."""

    def wrap(owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name, None)
        if fn is None:
            return

        async def counted(*args: Any, **kwargs: Any) -> Any:
            counts[label] += 1
            return await fn(*args, **kwargs)

        setattr(owner, name, counted)

    for name in _STORE_CALLS:
        wrap(store, name, name)
    for name in _CHECKPOINT_CALLS:
        wrap(store.stream_checkpoints, name, f"stream_checkpoints.{name}")


def _count_statements(counts: collections.Counter[str]) -> None:
    """Count every statement psycopg sends, named by what it calls."""
    import psycopg

    execute = psycopg.AsyncCursor.execute

    async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else str(query)
        found = _NAME.search(text)
        name = next((g for g in found.groups() if g), "?") if found else "?"
        if "renewed AS" in text:
            name = "renew (grouped)"
        counts[f"sql {name.lower()}"] += 1
        return await execute(self, query, *args, **kwargs)

    psycopg.AsyncCursor.execute = counted  # type: ignore[method-assign]


async def child(kind: str, url: str, n: int, seconds: float) -> dict[str, Any]:
    from wakeful import open_store
    from wakeful.agent import Agent
    from wakeful.fleet import LocalWake, Registry, Worker, submit
    from wakeful.runtime import ClaimPolicy

    counts: collections.Counter[str] = collections.Counter()
    async with open_store(url) as store:
        for i in range(n):
            await submit(store, f"t{i}", "paced", "go", dispatch_id=f"d{i}")
        _count_store(store, counts)
        if kind == "postgres":
            _count_statements(counts)
        registry = Registry(default="paced").add("paced", Agent("paced", Paced(seconds)))
        worker = Worker(
            store,
            registry,
            concurrency=n,
            claims=ClaimPolicy(ttl=30, renew_every=10),
            wake=LocalWake(),
            poll_interval=0.5,
            relay=False,
        )
        running = asyncio.create_task(worker.run())
        await _ended(worker, n, time.monotonic() + 10 * seconds + 60)
        frozen = dict(counts)  # before the stop's own calls
        await worker.stop(grace=5)
        await asyncio.wait({running}, timeout=30)
        done = worker.stats.done
    return {"counts": frozen, "done": done}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.concurrency_count")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=18.1)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    args = parser.parse_args(argv if argv is not None else [])
    root = Path(__file__).resolve().parent.parent
    for kind in args.stores.split(","):
        with tempfile.TemporaryDirectory(prefix="wakeful-count-") as tmp:
            db = None
            if kind == "sqlite":
                url = f"sqlite:///{tmp}/c.db"
            else:
                db = Database(args.dsn, f"wakeful_count_{os.getpid()}").create()
                url = db.dsn
            try:
                command = [sys.executable, "-m", "benchmarks.concurrency_count", "--child"]
                done = subprocess.run(
                    [*command, kind, url, str(args.n), str(args.seconds)],
                    cwd=root,
                    capture_output=True,
                    text=True,
                    timeout=20 * args.seconds + 300,
                )
            finally:
                if db is not None:
                    db.drop()
        if done.returncode != 0:
            raise RuntimeError(f"{kind} failed: {done.stderr[-2000:]}")
        data = json.loads(done.stdout.strip().splitlines()[-1])
        _print(kind, args.n, data)


def _print(kind: str, n: int, data: dict[str, Any]) -> None:
    counts: dict[str, int] = data["counts"]
    print(f"{kind}: N={n}, runs done {data['done']}; calls per run")
    for name in sorted(counts):
        print(f"  {name:40s} {counts[name] / n:8.2f}")
    store_fixed = sum(v for k, v in counts.items() if not k.startswith("sql ") and not _per_time(k))
    sql_fixed = sum(v for k, v in counts.items() if k.startswith("sql ") and not _per_time(k))
    print(f"  store calls per run, puts and renewals apart: {store_fixed / n:.2f}")
    if sql_fixed:
        print(f"  SQL statements per run, puts and renewals apart: {sql_fixed / n:.2f}")


def _per_time(name: str) -> bool:
    """Calls whose number grows with the stream's length, not with the run count."""
    return name in ("stream_checkpoints.put", "renew", "heartbeat") or name in (
        "sql put_stream_checkpoint",
        "sql renew",
        "sql renew (grouped)",
        "sql heartbeat",
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        kind, url, n, seconds = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
        print(json.dumps(asyncio.run(child(kind, url, n, seconds))), flush=True)
    else:
        main(sys.argv[1:])
