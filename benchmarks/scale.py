"""Scale curves: what grows with history, log size and thread count.

Run ``python -m benchmarks.scale [--rounds 3] [--dsn URL] [--commits 200] [--log-mb 1,10,100]
[--threads 10000]``.

- Commit cost vs thread history: on each store (memory, file, SQLite, PostgreSQL in a fresh
  database), a thread is given a history of 1, 100 or 10,000 messages (written 100 per
  commit, each commit also a checkpoint and an event), then ``--commits`` sequential commits
  are timed on it, each what an agent turn writes: a new checkpoint of ~1.5 kB state, one
  event and one message. Rounds interleave the history lengths on fresh threads; medians.
  The cost must stay flat: reported as the ratio 10k / 1 (read here as flat when <= 1.5x).
- Replay: seconds to open a file store whose log is 1, 10 and 100 MB (the file store
  benchmark's long-history log, pruned as a retention policy would), median of the rounds.
- Memory per idle thread: ``tracemalloc`` bytes retained per thread for ``--threads``
  threads, each holding one completed checkpoint of the ~1.5 kB state and one event, claim
  released: in the memory store (created in process) and in the file store (its projection
  after opening a log of those threads).

Read and claim paths against the number of threads, dispatches and events (issue 27) are
``benchmarks.scale_paths``, run beside this module by ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument
from benchmarks.file_store import _Recorder, build_log
from wakeful import open_store
from wakeful.records import Checkpoint, Commit, EventDraft, Message
from wakeful.store.contract import ThreadStore
from wakeful.store.file import open_file_store
from wakeful.store.file.log import header_line
from wakeful.store.memory import MemoryStore

HISTORIES = (1, 100, 10_000)
FLAT = 1.5
"""Our reading of "must stay flat": commit cost at 10k messages <= 1.5x the cost at 1."""


def payload(step: int) -> dict[str, Any]:
    """About 1.5 kB of JSON state, as in the store benchmarks."""
    return {
        "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 12}
            for i in range(10)
        ],
        "step": step,
    }


def message(thread: str, i: int) -> Message:
    return Message(id=f"{thread}-m{i}", role="user" if i % 2 else "assistant", content="x" * 200)


class Writer:
    """Commits to one claimed thread, chaining checkpoints."""

    def __init__(self, store: ThreadStore, thread: str) -> None:
        self.store, self.thread = store, thread
        self.token = 0
        self.parent: str | None = None
        self.step = self.messages = 0

    async def claim(self) -> None:
        self.token = (await self.store.claim(self.thread, "bench", 3600)).token

    async def commit(self, messages: int) -> None:
        cp = Checkpoint(
            id=f"{self.thread}-c{self.step}",
            parent=self.parent,
            run_id="run-1",
            status="running",
            state=payload(self.step),
            created_at=datetime.now(UTC),
        )
        batch = tuple(message(self.thread, self.messages + i) for i in range(messages))
        await self.store.commit(
            self.thread,
            Commit(
                token=self.token,
                checkpoint=cp,
                events=(EventDraft(type="step"),),
                messages=batch,
            ),
        )
        self.parent, self.step, self.messages = cp.id, self.step + 1, self.messages + messages


async def commit_cost(store: ThreadStore, thread: str, history: int, commits: int) -> float:
    """Microseconds per commit on a thread that already holds ``history`` messages."""
    writer = Writer(store, thread)
    await writer.claim()
    left = history
    while left > 0:
        await writer.commit(min(left, 100))
        left -= min(left, 100)
    start = time.perf_counter()
    for _ in range(commits):
        await writer.commit(1)
    elapsed = time.perf_counter() - start
    await store.release(thread, writer.token)
    return elapsed / commits * 1e6


async def history_round(
    urls: dict[str, str], r: int, commits: dict[str, int]
) -> dict[tuple[str, int], float]:
    costs = {}
    for name, url in urls.items():
        async with open_store(url) as store:
            await commit_cost(store, f"warm-r{r}", 1, 20)  # connections, statements, caches
            order = HISTORIES if r % 2 == 0 else tuple(reversed(HISTORIES))
            for history in order:
                thread = f"h{history}-r{r}"
                costs[(name, history)] = await commit_cost(store, thread, history, commits[name])
    return costs


async def open_seconds(root: Path) -> float:
    start = time.perf_counter()
    store = await open_file_store(root.as_uri(), compact_bytes=None)
    elapsed = time.perf_counter() - start
    await store.close()
    return elapsed


async def idle_threads(store: ThreadStore, count: int, prefix: str = "idle") -> None:
    state = payload(0)
    for i in range(count):
        thread = f"{prefix}-{i}"
        claim = await store.claim(thread, "bench", 60)
        cp = Checkpoint(
            id=f"{thread}-c0",
            parent=None,
            run_id="run-1",
            status="completed",
            state=state,
            created_at=datetime.now(UTC),
        )
        await store.commit(
            thread,
            Commit(token=claim.token, checkpoint=cp, events=(EventDraft(type="run.completed"),)),
        )
        await store.release(thread, claim.token)


async def memory_store_bytes(count: int) -> float:
    tracemalloc.start()
    try:
        store = MemoryStore()
        await idle_threads(store, 10, "warm")  # every code path runs once first
        before = tracemalloc.get_traced_memory()[0]
        await idle_threads(store, count)
        after = tracemalloc.get_traced_memory()[0]
        del store
    finally:
        tracemalloc.stop()
    return (after - before) / count


async def idle_log(root: Path, count: int) -> None:
    """A file store log of ``count`` idle threads, written without fsync by the store's own
    logic (as in the replay benchmark)."""
    os.makedirs(root)
    with (root / "commits.ndjson").open("wb") as out:
        out.write(header_line(0))
        await idle_threads(_Recorder(out), count)


async def file_store_bytes(root: Path, small: Path, count: int) -> float:
    """Bytes per thread retained by opening the file store at ``root`` (``count`` idle
    threads) beyond opening the one at ``small`` (10 of them)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        store = await open_file_store(small.as_uri(), compact_bytes=None)
        baseline = tracemalloc.get_traced_memory()[0] - base
        await store.close()
        del store
        base = tracemalloc.get_traced_memory()[0]
        store = await open_file_store(root.as_uri(), compact_bytes=None)
        loaded = tracemalloc.get_traced_memory()[0] - base
        await store.close()
    finally:
        tracemalloc.stop()
    return (loaded - baseline) / (count - 10)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--commits", type=int, default=200, help="timed commits per point")
    parser.add_argument("--log-mb", default="1,10,100", help="file store log sizes, MB")
    parser.add_argument("--threads", type=int, default=10_000, help="idle threads")
    rounds_argument(parser)
    args = parser.parse_args(argv if argv is not None else [])
    directory = Path(tempfile.mkdtemp(prefix="wakeful-bench-scale-"))
    db = Database(args.dsn, f"wakeful_bench_scale_{os.getpid()}")
    urls = {
        "memory": "memory://",
        "file": (directory / "fs").as_uri(),
        "sqlite": f"sqlite:///{directory / 'scale.db'}",
    }
    commits = {"memory": args.commits * 10, "file": args.commits, "sqlite": args.commits}
    skipped: str | None = None
    try:
        try:
            db.create()
            urls["postgresql"] = db.dsn
            commits["postgresql"] = args.commits
        except Exception as exc:  # no server or no driver: the other stores still run
            skipped = f"PostgreSQL skipped: {type(exc).__name__}: {exc}"
        costs: dict[tuple[str, int], list[float]] = {}
        for r in range(args.rounds):
            for key, cost in asyncio.run(history_round(urls, r, commits)).items():
                costs.setdefault(key, []).append(cost)
        sizes = [int(mb) for mb in args.log_mb.split(",") if mb]
        opens: dict[int, tuple[float, list[float]]] = {}
        for mb in sizes:
            root = directory / f"log-{mb}"
            asyncio.run(build_log(root, mb))
            size = (root / "commits.ndjson").stat().st_size / 1e6
            opens[mb] = (size, [asyncio.run(open_seconds(root)) for _ in range(args.rounds)])
            shutil.rmtree(root)
        memory = [asyncio.run(memory_store_bytes(args.threads)) for _ in range(args.rounds)]
        asyncio.run(idle_log(directory / "idle", args.threads))
        asyncio.run(idle_log(directory / "idle-small", 10))
        files = [
            asyncio.run(
                file_store_bytes(directory / "idle", directory / "idle-small", args.threads)
            )
            for _ in range(args.rounds)
        ]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if "postgresql" in urls:
            db.drop()
    return report(args, costs, opens, memory, files, skipped)


def report(
    args: argparse.Namespace,
    costs: dict[tuple[str, int], list[float]],
    opens: dict[int, tuple[float, list[float]]],
    memory: list[float],
    files: list[float],
    skipped: str | None,
) -> list[Result]:
    out = Collector("scale")
    stores = list(dict.fromkeys(name for name, _ in costs))
    print(f"commit cost vs thread history (us per commit, medians of {args.rounds} rounds)")
    print(f"{'store':<12}" + "".join(f"{f'{h:,} msgs':>14}" for h in HISTORIES) + f"{'10k/1':>9}")
    for name in stores:
        med = {h: statistics.median(costs[(name, h)]) for h in HISTORIES}
        ratio = med[HISTORIES[-1]] / med[HISTORIES[0]]
        cells = "".join(f"{med[h]:>14,.0f}" for h in HISTORIES)
        print(f"{name:<12}{cells}{ratio:>8.2f}x")
        out.add(f"commit cost, {name}, 100 messages of history", costs[(name, 100)], "us",
                higher_is_better=False)  # fmt: skip
        out.add(
            f"commit cost, {name}, 10,000 messages of history",
            costs[(name, 10_000)],
            "us",
            higher_is_better=False,
            anchor="the same store at 1 message",
            anchor_samples=costs[(name, 1)],
            target=FLAT,
        )
    if skipped:
        print(skipped)
        out.skip("commit cost, postgresql", "us", skipped)
    print("file store open (replay) time vs log size")
    for size, seconds in opens.values():
        took = statistics.median(seconds)
        print(f"  {size:>7.1f} MB  {took * 1e3:>9.1f} ms  {size / took:>6.0f} MB/s")
        out.add(
            f"open (replay) a {size:.0f} MB file store log",
            [s * 1e3 for s in seconds],
            "ms",
            higher_is_better=False,
            note=f"{size / took:.0f} MB/s",
        )
    print(f"memory per idle thread ({args.threads:,} threads, tracemalloc, medians)")
    for name, values in (("memory", memory), ("file", files)):
        print(f"  {name:<8} {statistics.median(values):>9,.0f} bytes")
        out.add(
            f"memory per idle thread, {name} store",
            values,
            "bytes",
            higher_is_better=False,
            note=f"{args.threads:,} threads, ~1.5 kB state each",
        )
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
