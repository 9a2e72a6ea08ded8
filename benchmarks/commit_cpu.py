"""Client CPU per sequential commit, per store.

Run ``python -m benchmarks.commit_cpu [--store memory|file|sqlite|postgres ...] [--n 2000]
[--messages 10] [--rounds 3] [--dsn URL]``. Each round opens a fresh store, claims one
thread and makes ``--n`` sequential commits after 50 untimed ones, each a checkpoint whose
state holds ``--messages`` chat messages (10: about 3 kB of JSON, 100: about 21 kB), one
event and an operation id: the runtime's common commit. Printed: process CPU
(``time.process_time``, the store's own threads included) per commit, median of the rounds.
Only public API is used, so two versions of the source compare in one run by alternating
``PYTHONPATH=<other checkout>/src`` (decision 0022, "Fourth round").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, bench_checkpoint
from wakeful import open_store
from wakeful.records import Commit, EventDraft

STORES = ("memory", "file", "sqlite", "postgres")
WARMUP = 50


def state(messages: int) -> dict[str, Any]:
    return {
        "messages": [
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"message {i} " * 12,
                "kwargs": {"id": str(i), "extra": [1, {"a": None}]},
            }
            for i in range(messages)
        ],
        "step": 3,
        "flags": {"approved": True, "retries": 0},
    }


async def cpu_per_commit(url: str, n: int, messages: int) -> float:
    """Process CPU seconds per commit over ``n`` sequential commits."""
    value = state(messages)
    async with await open_store(url) as store:
        thread = f"cpu-{uuid.uuid4().hex[:8]}"
        claim = await store.claim(thread, "bench", 3600)
        parent: str | None = None
        started = 0.0
        for i in range(WARMUP + n):
            if i == WARMUP:
                started = time.process_time()
            cp = bench_checkpoint(parent, value)
            commit = Commit(
                token=claim.token,
                checkpoint=cp,
                events=(EventDraft(type="step", data={"i": i}),),
                operation_id=f"op:{i}",
            )
            await store.commit(thread, commit)
            parent = cp.id
        return (time.process_time() - started) / n


def _url(store: str, directory: Path, dsn: str) -> str:
    if store == "memory":
        return "memory://"
    if store == "file":
        return f"file://{directory / 'root'}"
    if store == "sqlite":
        return f"sqlite:///{directory / 'store.db'}"
    return dsn


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.commit_cpu")
    parser.add_argument("--store", action="append", choices=STORES)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dsn",
        default=DEFAULT_DSN,
        help="PostgreSQL store URL (each round commits to a new thread)",
    )
    args = parser.parse_args(argv)
    medians: dict[str, float] = {}
    for store in args.store or STORES:
        samples = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="wakeful-cpu-") as directory:
                url = _url(store, Path(directory), args.dsn)
                samples.append(asyncio.run(cpu_per_commit(url, args.n, args.messages)))
        medians[store] = statistics.median(samples)
        print(
            f"{store:9s} {medians[store] * 1e6:8.1f} µs of CPU per commit "
            f"({args.messages} messages; rounds: "
            + ", ".join(f"{s * 1e6:.0f}" for s in samples)
            + ")"
        )
    return medians


if __name__ == "__main__":
    main()
