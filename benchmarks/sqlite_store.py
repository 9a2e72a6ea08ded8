"""Benchmark: the SQLite store beside LangGraph's ``SqliteSaver`` on the same disk.

Run ``python -m benchmarks.sqlite_store [--n 2000] [--rounds 3] [--dir PATH]``. It measures,
in one run and interleaved round by round (medians reported, since a VM's fsync latency
swings a lot):

- the machine's floor: 200-byte appends with an fsync each, per second;
- wakeful commits/s (a commit = one new checkpoint with the payload, fenced by a claim),
  sequential and from 8 concurrent writers (asyncio tasks on one store, each on its own
  thread);
- wakeful claim + commit + release cycles/s, sequential and 8 concurrent;
- LangGraph ``SqliteSaver.put`` of the same payload per second, sequential and from 8 OS
  threads, and ``AsyncSqliteSaver.aput`` (aiosqlite) sequential and from 8 tasks (skipped,
  saying so, when ``langgraph-checkpoint-sqlite`` is not installed);

and prints the ratios. Target (issue 22): commits >= 3x ``SqliteSaver.put`` at 8 writers.
Both stores fsync every commit (wakeful: WAL + ``synchronous=FULL``;
SqliteSaver: WAL + SQLite's default ``synchronous``, printed below).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import Collector, Result
from wakeful.records import Checkpoint, Commit
from wakeful.store import open_store
from wakeful.store.contract import Store

WRITERS = 8


def payload() -> dict[str, Any]:
    """About 1.5 KB of JSON state: a short conversation."""
    return {
        "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 12}
            for i in range(10)
        ],
        "step": 3,
        "flags": {"approved": True, "retries": 0},
    }


def fsync_floor(directory: Path, n: int) -> float:
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        start = time.perf_counter()
        for _ in range(n):
            os.write(fd, b"x" * 200)
            os.fsync(fd)
        return n / (time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()


def _checkpoint(parent: str | None, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        id=uuid.uuid4().hex,
        parent=parent,
        run_id="bench",
        status="running",
        state=state,
        created_at=datetime.now(UTC),
    )


async def _commits(store: Store, thread_id: str, n: int, state: dict[str, Any]) -> None:
    claim = await store.claim(thread_id, "bench", 3600)
    parent = None
    for _ in range(n):
        cp = _checkpoint(parent, state)
        await store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        parent = cp.id


async def _cycles(store: Store, thread_id: str, n: int, state: dict[str, Any]) -> None:
    parent = None
    for _ in range(n):
        claim = await store.claim(thread_id, "bench", 60)
        cp = _checkpoint(parent, state)
        await store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        await store.release(thread_id, claim.token)
        parent = cp.id


async def _timed(
    url: str, work: Callable[[Store, str, int, dict[str, Any]], Awaitable[None]], n: int, k: int
) -> float:
    """Operations per second for ``k`` concurrent writers doing ``n`` in total."""
    state = payload()
    async with open_store(url) as store:
        start = time.perf_counter()
        await asyncio.gather(*(work(store, f"t-{w}", n // k, state) for w in range(k)))
        elapsed = time.perf_counter() - start
    return (n // k) * k / elapsed


async def wakeful_rates(directory: Path, n: int) -> dict[str, float]:
    rates = {}
    for name, work in (("commit", _commits), ("cycle", _cycles)):
        for k in (1, WRITERS):
            url = f"sqlite:///{directory / f'wakeful-{name}-{k}.db'}"
            rates[f"{name} x{k}"] = await _timed(url, work, n, k)
    return rates


def langgraph_rates(directory: Path, n: int) -> tuple[dict[str, float], str]:
    try:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        return {}, "langgraph-checkpoint-sqlite is not installed: LangGraph column skipped"
    rates: dict[str, float] = {}
    synchronous = "?"
    state = payload()

    def put_many(saver: Any, w: int, count: int) -> None:
        config: Any = {"configurable": {"thread_id": f"t-{w}", "checkpoint_ns": ""}}
        for step in range(count):
            checkpoint: Any = empty_checkpoint()
            checkpoint["id"] = str(uuid.uuid4())
            checkpoint["channel_values"] = state
            config = saver.put(config, checkpoint, {"source": "loop", "step": step}, {})

    for k in (1, WRITERS):
        # check_same_thread=False is how SqliteSaver is meant to be shared (it has a lock).
        conn = sqlite3.connect(directory / f"langgraph-{k}.db", check_same_thread=False)
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            synchronous = str(conn.execute("PRAGMA synchronous").fetchone()[0])
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=k) as pool:
                for future in [pool.submit(put_many, saver, w, n // k) for w in range(k)]:
                    future.result()
            rates[f"put x{k}"] = (n // k) * k / (time.perf_counter() - start)
        finally:
            conn.close()
    return rates, f"SqliteSaver: WAL, PRAGMA synchronous={synchronous} (2 = FULL)"


async def langgraph_async_rates(directory: Path, n: int) -> dict[str, float]:
    """``AsyncSqliteSaver.aput`` (aiosqlite: like wakeful, SQLite off the event loop)."""
    try:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    except ImportError:
        return {}
    state = payload()
    rates: dict[str, float] = {}

    async def put_many(saver: Any, w: int, count: int) -> None:
        config: Any = {"configurable": {"thread_id": f"t-{w}", "checkpoint_ns": ""}}
        for step in range(count):
            checkpoint: Any = empty_checkpoint()
            checkpoint["id"] = str(uuid.uuid4())
            checkpoint["channel_values"] = state
            config = await saver.aput(config, checkpoint, {"source": "loop", "step": step}, {})

    for k in (1, WRITERS):
        async with AsyncSqliteSaver.from_conn_string(str(directory / f"lg-async-{k}.db")) as saver:
            await saver.setup()
            start = time.perf_counter()
            await asyncio.gather(*(put_many(saver, w, n // k) for w in range(k)))
            rates[f"aput x{k}"] = (n // k) * k / (time.perf_counter() - start)
    return rates


def results(samples: dict[str, list[float]], skipped: str | None) -> list[Result]:
    out = Collector("sqlite_store")
    out.add("append+fsync (200 B), one writer", samples["floor"], "/s")
    for label, key, anchor, target in (
        # Issue 22 restated the targets: >= 3x at 8 writers; a sequential writer waits for
        # its own fsync on both sides (decision 0005), so that ratio is a figure only.
        ("commit, sequential", "commit x1", "put x1", None),
        (f"commit, {WRITERS} concurrent writers", f"commit x{WRITERS}", f"put x{WRITERS}", 3.0),
        ("claim+commit+release, sequential", "cycle x1", "put x1", None),
        (f"claim+commit+release, {WRITERS} concurrent", f"cycle x{WRITERS}", f"put x{WRITERS}",
         None),
    ):  # fmt: skip
        threads = anchor.split("x")[1]
        out.add(
            label,
            samples[key],
            "/s",
            anchor=f"LangGraph SqliteSaver.put, {threads} thread(s)",
            anchor_samples=samples.get(anchor),
            target=target,
            skipped=skipped,
        )
    for key, anchor in (("commit x1", "aput x1"), (f"commit x{WRITERS}", f"aput x{WRITERS}")):
        if anchor in samples:
            tasks = anchor.split("x")[1]
            out.add(
                f"commit x{key.split('x')[1]} (vs the async saver)",
                samples[key],
                "/s",
                anchor=f"LangGraph AsyncSqliteSaver.aput, {tasks} task(s)",
                anchor_samples=samples[anchor],
            )
    for key, label in (
        ("put x1", "LangGraph SqliteSaver.put, 1 thread"),
        (f"put x{WRITERS}", f"LangGraph SqliteSaver.put, {WRITERS} threads"),
        ("aput x1", "LangGraph AsyncSqliteSaver.aput, 1 task"),
        (f"aput x{WRITERS}", f"LangGraph AsyncSqliteSaver.aput, {WRITERS} tasks"),
    ):
        if key in samples:
            out.add(label, samples[key], "/s")
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=2000, help="operations per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to test")
    args = parser.parse_args(argv if argv is not None else [])
    samples: dict[str, list[float]] = {}
    note = ""
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-", dir=args.dir) as tmp:
        # Rounds interleave every measurement, so a slow spell of the disk hits all of them.
        for r in range(args.rounds):
            directory = Path(tmp) / f"round-{r}"
            directory.mkdir()
            rates = {"floor": fsync_floor(directory, min(args.n, 2000))}
            rates.update(asyncio.run(wakeful_rates(directory, args.n)))
            theirs, note = langgraph_rates(directory, args.n)
            rates.update(theirs)
            rates.update(asyncio.run(langgraph_async_rates(directory, args.n)))
            for key, rate in rates.items():
                samples.setdefault(key, []).append(rate)
    med = {key: statistics.median(values) for key, values in samples.items()}
    print(f"disk: {Path(tmp).parent}  operations per measurement: {args.n}  rounds: {args.rounds}")
    print(f"machine floor: {med['floor']:,.0f} append+fsync/s (one writer), median")
    print(f"{'measurement (median per second)':<46}{'per second':>12}{'vs LangGraph':>14}")
    for label, key, anchor in (
        ("wakeful commit, sequential", "commit x1", "put x1"),
        (f"wakeful commit, {WRITERS} concurrent writers", f"commit x{WRITERS}", f"put x{WRITERS}"),
        ("wakeful claim+commit+release, sequential", "cycle x1", "put x1"),
        (
            f"wakeful claim+commit+release, {WRITERS} concurrent",
            f"cycle x{WRITERS}",
            f"put x{WRITERS}",
        ),
    ):
        ratio = f"{med[key] / med[anchor]:.2f}x" if anchor in med else "-"
        print(f"{label:<46}{med[key]:>12,.0f}{ratio:>14}")
    for key in ("put x1", f"put x{WRITERS}"):
        if key in med:
            threads = key.split("x")[1]
            print(f"{'LangGraph SqliteSaver.put, ' + threads + ' thread(s)':<46}{med[key]:>12,.0f}")
    for key in ("aput x1", f"aput x{WRITERS}"):
        if key in med:
            tasks = key.split("x")[1]
            label = f"LangGraph AsyncSqliteSaver.aput, {tasks} task(s)"
            print(f"{label:<46}{med[key]:>12,.0f}")
    if "aput x1" in med:
        print(
            f"wakeful vs AsyncSqliteSaver: sequential {med['commit x1'] / med['aput x1']:.2f}x, "
            f"{WRITERS} concurrent {med[f'commit x{WRITERS}'] / med[f'aput x{WRITERS}']:.2f}x"
        )
    print(note)
    return results(samples, None if "put x1" in samples else note)


if __name__ == "__main__":
    main(sys.argv[1:])
