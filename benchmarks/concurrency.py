"""Concurrency at the cost of waiting: one worker holding N runs that each stream a model
reply for many seconds, against a plain asyncio script that streams the same replies and
stores nothing, measured in the same run (issue 24).

Each run is one agent turn: a 600-character reply as 150 text deltas spread over
``--seconds`` or ``--n N:S`` (the issue's experiment: 18.1 s; ``make bench`` streams 18.1 s
at N = 1,000, where the targets are judged, and 6 s at 100 and 5,000), with
stream checkpoints on, ``ClaimPolicy(ttl=30, renew_every=10)``. Every measurement runs in a
fresh subprocess (so peak RSS and CPU are its own): the worker drains N pre-submitted
dispatches with concurrency N. Reported per store and N: wall time against the ideal (the
stream's length), worker CPU against the baseline's, peak RSS against the baseline's + 40 KB
a run, event-loop lag p99 (a 10 ms ticker's overshoot), transactions per second (PostgreSQL:
the database's ``xact_commit``; SQLite: the store's write transactions, each holding a group
of writes), where the wall's overshoot goes (``last start``: from the worker's start to the
last run's model stream starting; ``tail``: from the last delta of any stream to the last run
ended), and how many runs ended exactly once (one ``run.completed``, the full reply, no
stream checkpoint left) and how many were left stuck.

The worker process tunes its garbage collector as `wakeful worker` does by default
(`--gc worker`, `wakeful.fleet.gctune`); `--gc python` measures it with Python's settings.

The baseline's streams start at random moments spread over ``--spread`` seconds (0.5 s by
default; the worker's own runs start over 0.4-0.8 s as their admissions commit), as
independent model streams do. It is also measured with every stream started in the same
loop iteration (``lockstep``) and reported beside it, not judged: then all 1,000 streams'
sleeps expire together, one loop iteration serves ~120 deltas, and the loop's CPU per delta
falls to about a third of what any spread of 40 ms or more gives (decision 0024, "Seventh
session": the baseline, the lead's call).

Targets at N = 1000: wall <= 1.05x ideal; CPU <= 3x the baseline's; loop lag p99 <= 20 ms;
peak RSS <= baseline + 40 KB per run. Every N: every run ends exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument

REPLY = "abcd" * 150
DELTAS = 150
TICK = 0.01


class Paced:
    """Streams ``REPLY`` as ``DELTAS`` text deltas spread evenly over ``seconds``."""

    model = "paced"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.first = 0.0
        """When the last stream to start started (monotonic)."""
        self.last = 0.0
        """When the last delta of any stream was yielded (monotonic)."""

    def stream(self, request: Any) -> AsyncIterator[Any]:
        return self._play()

    async def _play(self) -> AsyncIterator[Any]:
        from wakeful.providers.base import StreamEnd, TextDelta, Usage

        size = len(REPLY) // DELTAS
        start = time.monotonic()
        self.first = max(self.first, start)
        for i in range(DELTAS):
            ahead = start + (i + 1) * self.seconds / DELTAS - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            yield TextDelta(REPLY[i * size : (i + 1) * size])
        self.last = max(self.last, time.monotonic())
        yield StreamEnd("end_turn", Usage(1, DELTAS))


class LagMonitor:
    """A ticker every ``TICK`` seconds; its overshoot is the event loop's lag."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + TICK
            await asyncio.sleep(TICK)
            self.lags.append(max(0.0, time.monotonic() - due))

    async def stop(self) -> float:
        """The p99 lag in seconds."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if len(self.lags) < 2:
            return 0.0
        return statistics.quantiles(self.lags, n=100)[98]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb() -> float:
    """This process's own peak resident set: ``VmHWM``, the high-water mark of its address
    space, which starts afresh at ``exec``. Not ``ru_maxrss``: Linux carries that over
    ``exec`` from the address space the child was forked from, so every child of this
    benchmark would report at least its parent's resident set (35 MB under ``python -m
    benchmarks``, above the plain asyncio baseline's own 28 MB, which lifted the RSS limit
    by 7 MB). ``ru_maxrss`` where ``/proc`` is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---------------------------------------------------------------- the children


async def baseline_child(n: int, seconds: float, spread: float) -> dict[str, Any]:
    """N concurrent streams, each accumulated into a string; nothing stored. Stream ``i``
    starts at a random moment of the first ``spread`` seconds (0: all in the first loop
    iteration, in lockstep); the same moments in every round (a fixed seed)."""
    provider = Paced(seconds)
    rng = random.Random(24)
    delays = [rng.uniform(0, spread) if spread > 0 else 0.0 for _ in range(n)]

    async def one(delay: float) -> str:
        if delay:
            await asyncio.sleep(delay)
        text = ""
        async for item in provider.stream(None):
            text += getattr(item, "text", "")
        return text

    monitor = LagMonitor()
    monitor.start()
    cpu, start = _cpu(), time.monotonic()
    replies = await asyncio.gather(*(one(delay) for delay in delays))
    wall, cpu = time.monotonic() - start, _cpu() - cpu
    lag = await monitor.stop()
    ok = sum(1 for r in replies if r == REPLY)
    return {"wall": wall, "cpu": cpu, "lag": lag, "rss": _peak_rss_mb(), "once": ok, "stuck": 0}


async def wakeful_child(
    kind: str, url: str, n: int, seconds: float, gc_setting: str = "worker"
) -> dict[str, Any]:
    from wakeful import open_store
    from wakeful.agent import Agent
    from wakeful.fleet import LocalWake, Registry, Worker, gctune, submit
    from wakeful.runtime import ClaimPolicy

    async with open_store(url) as store:
        for i in range(n):
            await submit(store, f"t{i}", "paced", "go", dispatch_id=f"d{i}")
        provider = Paced(seconds)
        registry = Registry(default="paced").add("paced", Agent("paced", provider))
        worker = Worker(
            store,
            registry,
            concurrency=n,
            claims=ClaimPolicy(ttl=30, renew_every=10),
            wake=LocalWake(),
            poll_interval=0.5,
            relay=False,
        )
        # as ``wakeful worker`` does by default (``--gc``, docs/operations.md)
        gctune.tune(gctune.parse(gc_setting))
        before = _transactions(store, kind, url)
        monitor = LagMonitor()
        monitor.start()
        cpu, start = _cpu(), time.monotonic()
        running = asyncio.create_task(worker.run())
        await _ended(worker, n, start + 10 * seconds + 60)
        end = time.monotonic()
        wall, cpu = end - start, _cpu() - cpu
        lag = await monitor.stop()
        await worker.stop(grace=5)
        await asyncio.wait({running}, timeout=30)
        transactions = _transactions(store, kind, url) - before
        once, stuck = await _verify(store, n)
    return {
        "wall": wall,
        "cpu": cpu,
        "lag": lag,
        "rss": _peak_rss_mb(),
        "once": once,
        "stuck": stuck,
        "transactions": transactions,
        "admit": provider.first - start,
        "tail": end - provider.last,
    }


async def _ended(worker: Any, n: int, deadline: float) -> None:
    """Return once ``n`` dispatches were settled or fenced, or at ``deadline`` (stuck runs
    are counted afterwards)."""
    while True:
        if worker.stats.done + worker.stats.fenced >= n or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.05)


def _transactions(store: Any, kind: str, url: str) -> int:
    if kind == "sqlite":
        return int(store._db.transactions)
    import psycopg

    time.sleep(0.6)  # sessions report their statistics at most every 500 ms
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


async def _verify(store: Any, n: int) -> tuple[int, int]:
    """Runs that ended exactly once; runs left unfinished (the dispatch not done)."""
    once = stuck = 0
    for i in range(n):
        d = await store.get_dispatch(f"d{i}")
        if d is None or d.status != "done":
            stuck += 1
            continue
        events = [e.type for e in await store.events_after(f"t{i}", 0, 100)]
        messages = await store.messages(f"t{i}", 0, 10)
        leftover = await store.stream_checkpoints.get(f"run-d{i}")
        if (
            events.count("run.completed") == 1
            and [m.role for m in messages] == ["user", "assistant"]
            and messages[1].content == REPLY
            and leftover is None
        ):
            once += 1
    return once, stuck


def child_main(argv: list[str]) -> None:
    kind, url, n, seconds, gc_setting = argv[0], argv[1], int(argv[2]), float(argv[3]), argv[4]
    if kind == "baseline":
        data = asyncio.run(baseline_child(n, seconds, float(url)))
    else:
        data = asyncio.run(wakeful_child(kind, url, n, seconds, gc_setting))
    print(json.dumps(data), flush=True)


def measure(
    kind: str, url: str, n: int, seconds: float, gc_setting: str = "worker"
) -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.concurrency",
            "--child",
            kind,
            url,
            str(n),
            str(seconds),
            gc_setting,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=20 * seconds + 300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{kind} N={n} failed: {done.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


# ---------------------------------------------------------------- the module


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.concurrency")
    rounds_argument(parser, default=1)
    parser.add_argument(
        "--n",
        default="100,1000,5000",
        help="run counts, comma-separated; N:S streams S seconds at that N instead of --seconds",
    )
    parser.add_argument("--seconds", type=float, default=18.1, help="length of each stream")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument(
        "--gc",
        default="worker",
        help="the worker's garbage-collector setting, as `wakeful worker --gc` (default: its "
        "default); python for Python's own",
    )
    parser.add_argument(
        "--spread",
        type=float,
        default=0.5,
        help="seconds over which the judged baseline's streams start (the lockstep baseline, "
        "all at once, is reported beside it)",
    )
    parser.add_argument(
        "--single-round", action="store_true", help="one round whatever --rounds says"
    )
    args = parser.parse_args(argv if argv is not None else [])
    rounds = 1 if args.single_round else args.rounds
    sizes = [_size(x, args.seconds) for x in args.n.split(",")]
    stores = args.stores.split(",")
    collector = Collector("concurrency")
    table: list[list[str]] = []
    for n, seconds in sizes:
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ["baseline", "lockstep", *stores]}
        for _ in range(rounds):
            runs["baseline"].append(measure("baseline", str(args.spread), n, seconds))
            runs["lockstep"].append(measure("baseline", "0", n, seconds))
            for kind in stores:
                with tempfile.TemporaryDirectory(prefix="wakeful-conc-") as tmp:
                    if kind == "sqlite":
                        runs[kind].append(
                            measure(kind, f"sqlite:///{tmp}/c.db", n, seconds, args.gc)
                        )
                    else:
                        db = Database(args.dsn, f"wakeful_conc_{os.getpid()}").create()
                        try:
                            runs[kind].append(measure(kind, db.dsn, n, seconds, args.gc))
                        finally:
                            db.drop()
        base, lockstep = runs["baseline"], runs["lockstep"]
        table.append(_row(f"asyncio baseline ({args.spread:g} s)", n, seconds, base, base))
        table.append(_row("asyncio, lockstep", n, seconds, lockstep, base))
        for kind in stores:
            got = runs[kind]
            table.append(_row(kind, n, seconds, got, base))
            _collect(collector, kind, n, seconds, got, base, lockstep, args.spread)
    _print(table)
    return collector.results


def _size(spec: str, seconds: float) -> tuple[int, float]:
    """``N`` or ``N:S`` (N runs streaming S seconds each)."""
    n, _, own = spec.partition(":")
    return int(n), float(own) if own else seconds


def _med(values: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(v[key] for v in values))


def _row(
    name: str, n: int, seconds: float, got: list[dict[str, Any]], base: list[dict[str, Any]]
) -> list[str]:
    wall = _med(got, "wall")
    tx = _med(got, "transactions") / wall if "transactions" in got[0] else 0.0
    return [
        name,
        str(n),
        f"{wall:.1f} s ({wall / seconds:.2f}x)",
        f"{_med(got, 'cpu'):.1f} s ({_med(got, 'cpu') / max(_med(base, 'cpu'), 1e-9):.1f}x)",
        f"{_med(got, 'rss'):.0f} MB",
        f"{_med(got, 'lag') * 1000:.0f} ms",
        f"{tx:,.0f}" if tx else "-",
        f"{int(min(v['once'] for v in got))}/{n}",
        str(int(max(v["stuck"] for v in got))),
        f"{_med(got, 'admit'):.2f} / {_med(got, 'tail'):.2f} s" if "admit" in got[0] else "-",
    ]


def _collect(
    c: Collector,
    kind: str,
    n: int,
    seconds: float,
    got: list[dict[str, Any]],
    base: list[dict[str, Any]],
    lockstep: list[dict[str, Any]],
    spread: float,
) -> None:
    at = f"{kind}, N={n}"
    judged = n == 1000
    c.add(
        f"wall, {at}",
        [v["wall"] for v in got],
        "s",
        higher_is_better=False,
        anchor="ideal (the stream's length)",
        anchor_samples=seconds,
        target=1.05 if judged else None,
    )
    c.add(
        f"worker CPU, {at}",
        [v["cpu"] for v in got],
        "s",
        higher_is_better=False,
        anchor=f"plain asyncio baseline, same N, starts spread over {spread:g} s",
        anchor_samples=[v["cpu"] for v in base],
        target=3.0 if judged else None,
    )
    c.add(
        f"worker CPU vs lockstep, {at}",
        [v["cpu"] for v in got],
        "s",
        higher_is_better=False,
        anchor="plain asyncio baseline, same N, all streams started at once",
        anchor_samples=[v["cpu"] for v in lockstep],
    )
    c.add(
        f"event-loop lag p99, {at}",
        [v["lag"] * 1000 for v in got],
        "ms",
        higher_is_better=False,
        anchor="limit",
        anchor_samples=20.0,
        target=1.0 if judged else None,
    )
    c.add(
        f"peak RSS, {at}",
        [v["rss"] for v in got],
        "MB",
        higher_is_better=False,
        anchor="baseline + 40 KB a run",
        anchor_samples=[v["rss"] + n * 40 / 1024 for v in base],
        target=1.0 if judged else None,
    )
    c.add(
        f"transactions/s, {at}",
        [v["transactions"] / v["wall"] for v in got],
        "tx/s",
    )
    c.add(
        f"runs ended exactly once, {at}",
        [v["once"] for v in got],
        "runs",
        anchor="N",
        anchor_samples=n,
        target=1.0,
        note=f"stuck: {max(v['stuck'] for v in got)}",
    )


def _print(rows: list[list[str]]) -> None:
    headers = ["store", "N", "wall (x ideal)", "CPU (x base)", "peak RSS", "lag p99", "tx/s"]
    headers += ["exactly once", "stuck", "last start / tail"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
