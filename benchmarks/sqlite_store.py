"""Benchmark: the SQLite store beside LangGraph's ``SqliteSaver`` on the same disk.

Run ``python -m benchmarks.sqlite_store [--n 2000] [--rounds 3] [--dir PATH]``. It measures,
in one run, every measurement of a round in ``SLICES`` alternating slices and rounds repeated
(medians reported), since a VM's fsync latency swings a lot within seconds:

- the machine's floor: 200-byte appends with an fsync each, per second;
- wakeful commits/s (a commit = one new checkpoint with the payload, fenced by a claim),
  sequential and from 8 concurrent writers (asyncio tasks on one store, each on its own
  thread);
- wakeful claim + commit + release cycles/s, sequential and 8 concurrent;
- LangGraph ``SqliteSaver.put`` of the same payload per second, sequential and from 8 OS
  threads, and ``AsyncSqliteSaver.aput`` (aiosqlite) sequential and from 8 tasks (skipped,
  saying so, when ``langgraph-checkpoint-sqlite`` is not installed);

- the fenced group commit ceiling (``benchmarks.sqlite_ceiling``): the least a store that
  fences its commits and keeps ``sqlite3`` off the event loop must do at 8 writers, without
  any check of a commit, with the least check of its types and with the contract's
  validation, and the same statements on the event loop, which the stack does not allow;

and prints the ratios. Target (issue 22): commits >= 3x ``SqliteSaver.put`` at 8 writers;
the ceiling's own ratio is that target's bound (decision 0022).
Both stores fsync every commit (wakeful: WAL + ``synchronous=FULL``;
SqliteSaver: WAL + SQLite's default ``synchronous``, printed below).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import Collector, Result, bench_checkpoint, payload
from benchmarks.sqlite_ceiling import CEILINGS, open_ceilings
from wakeful.records import Commit
from wakeful.store import open_store
from wakeful.store.contract import Store

WRITERS = 8


async def _commits(store: Store, thread_id: str, n: int, state: dict[str, Any]) -> None:
    claim = await store.claim(thread_id, "bench", 3600)
    parent = None
    for _ in range(n):
        cp = bench_checkpoint(parent, state)
        await store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        parent = cp.id


async def _cycles(store: Store, thread_id: str, n: int, state: dict[str, Any]) -> None:
    parent = None
    for _ in range(n):
        claim = await store.claim(thread_id, "bench", 60)
        cp = bench_checkpoint(parent, state)
        await store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        await store.release(thread_id, claim.token)
        parent = cp.id


SLICES = 5
"""Each round runs every measurement in this many alternating slices (as ``file_store``
does), so that a drift of the disk's fsync latency within the round hits all of them alike."""


class _Measure:
    """One measurement of a round: ``k`` concurrent writers, ``slice_ops`` operations per
    slice in total; accumulates operations and seconds over the slices."""

    def __init__(self, key: str, k: int) -> None:
        self.key = key
        self.k = k
        self.ops = 0
        self.seconds = 0.0

    def add(self, ops: int, seconds: float) -> None:
        self.ops += ops
        self.seconds += seconds

    @property
    def rate(self) -> float:
        return self.ops / self.seconds


async def sliced_round(directory: Path, n: int, slices: int) -> tuple[dict[str, float], str]:
    """Every measurement of one round, in ``slices`` alternating slices, on one event loop
    (the wakeful stores and the async saver stay open across slices; the sync saver's OS
    threads run from it, blocking it, while nothing else runs)."""
    state = payload()
    per_slice = max(n // slices, WRITERS)
    rates: dict[str, float] = {}
    floor_ops = min(n, 2000) // slices
    floor = _Measure("floor", 1)
    stores: dict[str, tuple[Store, Callable[..., Awaitable[None]], _Measure]] = {}
    savers: list[tuple[sqlite3.Connection, Any, _Measure]] = []
    ceilings = {
        name: (ceiling, _Measure(f"{name} x{WRITERS}", WRITERS))
        for name, ceiling in open_ceilings(directory).items()
    }
    note = "langgraph-checkpoint-sqlite is not installed: LangGraph column skipped"
    try:
        works: tuple[tuple[str, Callable[..., Awaitable[None]]], ...] = (
            ("commit", _commits),
            ("cycle", _cycles),
        )
        for name, work in works:
            for k in (1, WRITERS):
                url = f"sqlite:///{directory / f'wakeful-{name}-{k}.db'}"
                store = await open_store(url)
                stores[f"{name} x{k}"] = (store, work, _Measure(f"{name} x{k}", k))
        savers = _langgraph_savers(directory)
        async with _async_savers(directory) as async_savers:
            if savers:
                synchronous = str(savers[0][1].conn.execute("PRAGMA synchronous").fetchone()[0])
                note = f"SqliteSaver: WAL, PRAGMA synchronous={synchronous} (2 = FULL)"
            for sl in range(slices):
                start = time.perf_counter()
                fsync_ops(directory, floor_ops)
                floor.add(floor_ops, time.perf_counter() - start)
                for store, work, m in stores.values():
                    each = per_slice // m.k
                    start = time.perf_counter()
                    await asyncio.gather(
                        *(work(store, f"t-{sl}-{w}", each, state) for w in range(m.k))
                    )
                    m.add(each * m.k, time.perf_counter() - start)
                each = per_slice // WRITERS
                for ceiling, m in ceilings.values():
                    m.add(each * WRITERS, await ceiling.seconds(f"t-{sl}", WRITERS, each, state))
                for _, saver, m in savers:
                    each = per_slice // m.k
                    m.add(each * m.k, _put_seconds(saver, sl, m.k, each, state))
                for saver, m in async_savers:
                    each = per_slice // m.k
                    start = time.perf_counter()
                    await asyncio.gather(
                        *(_aput_many(saver, f"t-{sl}-{w}", each, state) for w in range(m.k))
                    )
                    m.add(each * m.k, time.perf_counter() - start)
            rates["floor"] = floor.rate
            for _, _, m in stores.values():
                rates[m.key] = m.rate
            for _, m in ceilings.values():
                rates[m.key] = m.rate
            for _, _, m in savers:
                rates[m.key] = m.rate
            for _, m in async_savers:
                rates[m.key] = m.rate
    finally:
        for store, _, _ in stores.values():
            await store.close()
        for conn, _, _ in savers:
            conn.close()
        for ceiling, _ in ceilings.values():
            ceiling.close()
    return rates, note


def fsync_ops(directory: Path, n: int) -> None:
    """``n`` 200-byte appends with an fsync each (the machine's floor)."""
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(n):
            os.write(fd, b"x" * 200)
            os.fsync(fd)
    finally:
        os.close(fd)


def _langgraph_savers(directory: Path) -> list[tuple[sqlite3.Connection, Any, _Measure]]:
    """A ``SqliteSaver`` per writer count, each on its own file and connection, shared by
    its OS threads (``check_same_thread=False``: the saver has a lock)."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        return []
    out = []
    for k in (1, WRITERS):
        conn = sqlite3.connect(directory / f"langgraph-{k}.db", check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        out.append((conn, saver, _Measure(f"put x{k}", k)))
    return out


def _put_seconds(saver: Any, sl: int, k: int, each: int, state: dict[str, Any]) -> float:
    """Seconds for ``k`` OS threads each putting ``each`` checkpoints to its own thread."""
    from langgraph.checkpoint.base import empty_checkpoint

    def put_many(w: int) -> None:
        config: Any = {"configurable": {"thread_id": f"t-{sl}-{w}", "checkpoint_ns": ""}}
        for step in range(each):
            checkpoint: Any = empty_checkpoint()
            checkpoint["id"] = str(uuid.uuid4())
            checkpoint["channel_values"] = state
            config = saver.put(config, checkpoint, {"source": "loop", "step": step}, {})

    start = time.perf_counter()
    if k == 1:
        put_many(0)
    else:
        with ThreadPoolExecutor(max_workers=k) as pool:
            for future in [pool.submit(put_many, w) for w in range(k)]:
                future.result()
    return time.perf_counter() - start


@contextlib.asynccontextmanager
async def _async_savers(directory: Path) -> AsyncIterator[list[tuple[Any, _Measure]]]:
    """``AsyncSqliteSaver`` (aiosqlite: like wakeful, SQLite off the event loop) per writer
    count; none when it is not installed."""
    try:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    except ImportError:
        yield []
        return
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for k in (1, WRITERS):
            path = str(directory / f"lg-async-{k}.db")
            saver = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(path))
            await saver.setup()
            out.append((saver, _Measure(f"aput x{k}", k)))
        yield out


async def _aput_many(saver: Any, thread_id: str, count: int, state: dict[str, Any]) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    for step in range(count):
        checkpoint: Any = empty_checkpoint()
        checkpoint["id"] = str(uuid.uuid4())
        checkpoint["channel_values"] = state
        config = await saver.aput(config, checkpoint, {"source": "loop", "step": step}, {})


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
    # The bound of the 8-writer target (decision 0022): the least a fenced store keeping
    # sqlite3 off the event loop does, measured in the same slices (benchmarks.sqlite_ceiling).
    for key, label, _, note in CEILINGS:
        out.add(
            label.format(w=WRITERS),
            samples[f"{key} x{WRITERS}"],
            "/s",
            anchor=f"LangGraph SqliteSaver.put, {WRITERS} thread(s)",
            anchor_samples=samples.get(f"put x{WRITERS}"),
            note=note,
        )
    ceiling = CEILINGS[0][1].format(w=WRITERS)
    out.add(
        f"commit, {WRITERS} concurrent writers, against the ceiling",
        samples[f"commit x{WRITERS}"],
        "/s",
        anchor=ceiling,
        anchor_samples=samples[f"ceiling x{WRITERS}"],
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
        # Every round alternates slices of every measurement, so that a slow spell of the
        # disk hits all of them; rounds repeat it (medians).
        for r in range(args.rounds):
            directory = Path(tmp) / f"round-{r}"
            directory.mkdir()
            rates, note = asyncio.run(sliced_round(directory, args.n, SLICES))
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
    for key, _, label, _ in CEILINGS:
        measured, anchor = f"{key} x{WRITERS}", f"put x{WRITERS}"
        ratio = f"{med[measured] / med[anchor]:.2f}x" if anchor in med else "-"
        print(f"{label.format(w=WRITERS):<46}{med[measured]:>12,.0f}{ratio:>14}")
    share = med[f"commit x{WRITERS}"] / med[f"ceiling x{WRITERS}"]
    print(f"wakeful at {WRITERS} writers: {share:.2f}x the off-loop ceiling (sqlite_ceiling.py)")
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
