"""Where the worker's memory per run goes in ``benchmarks.concurrency`` (issue 24, part 2):
the same experiment (one worker, N runs each streaming a 600-character reply as 150 deltas),
measured mid-stream at two run counts, the difference divided by the runs between them.

Each measurement runs in a fresh subprocess. Without ``--trace`` it reports the process's
resident set (``/proc/self/statm``) after the imports and mid-stream, for the plain asyncio
baseline and each store; with ``--trace`` it also takes a ``tracemalloc`` snapshot
mid-stream and prints the allocation sites whose live size grew the most per run between
the two counts (tracemalloc slows the worker down: its figures are sizes, not times).

    python -m benchmarks.concurrency_memory --n 200,1000 --seconds 10 --trace
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import types
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Database
from benchmarks.concurrency import Paced, baseline_child


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


async def _child(kind: str, url: str, n: int, seconds: float, trace: str) -> dict[str, Any]:
    if kind == "baseline":
        loaded = _rss_kb()
        task = asyncio.create_task(baseline_child(n, seconds, 0.5))
        await asyncio.sleep(seconds * 0.6)
        mid = _rss_kb()
        await task
        return {"loaded": loaded, "mid": mid}
    from wakeful import open_store
    from wakeful.agent import Agent
    from wakeful.fleet import LocalWake, Registry, Worker, submit
    from wakeful.runtime import ClaimPolicy

    async with open_store(url) as store:
        for i in range(n):
            await submit(store, f"t{i}", "paced", "go", dispatch_id=f"d{i}")
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
        gc.collect()
        loaded = _rss_kb()
        if trace:
            tracemalloc.start(int(os.environ.get("FRAMES", "1")))
        running = asyncio.create_task(worker.run())
        # Mid-stream: every run admitted, about half its reply streamed.
        deadline = time.monotonic() + 10 * seconds
        while worker.busy < n and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(seconds * 0.5)
        mid = _rss_kb()
        if os.environ.get("TYPES"):
            _dump_types(f"{os.environ['TYPES']}-{kind}-{n}.json")
        if trace:
            tracemalloc.take_snapshot().dump(trace)
            tracemalloc.stop()
        await worker.stop(grace=seconds * 3)
        await asyncio.wait({running}, timeout=60)
    return {"loaded": loaded, "mid": mid}


def _dump_types(path: str) -> None:
    """The live objects the collector tracks, by type: count and shallow size."""
    counts: dict[str, list[int]] = {}
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        try:  # (some proxies raise on an unknown attribute: a ctypes library loader)
            code = getattr(obj, "cr_code", None) or getattr(obj, "ag_code", None)
            code = code or getattr(obj, "gi_code", None)
        except Exception:
            code = None
        if isinstance(code, types.CodeType):  # a coroutine or generator: by its function
            name = f"{name} {code.co_qualname}"
        row = counts.setdefault(name, [0, 0])
        row[0] += 1
        row[1] += sys.getsizeof(obj)
    if os.environ.get("DICTS"):  # who holds the large dicts (slow: a small N only)
        for obj in gc.get_objects():
            if type(obj) is dict and sys.getsizeof(obj) >= 300:
                owners = [type(r).__qualname__ for r in gc.get_referrers(obj) if r is not counts]
                key = f"dict {sys.getsizeof(obj)} of {','.join(sorted(owners)[:3])}"
                row = counts.setdefault(key, [0, 0])
                row[0] += 1
                row[1] += sys.getsizeof(obj)
    with open(path, "w") as f:
        json.dump(counts, f)


def _measure(kind: str, url: str, n: int, seconds: float, trace: str) -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    argv = [kind, url, str(n), str(seconds), trace]
    cmd = [sys.executable, "-m", "benchmarks.concurrency_memory", "--child", *argv]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} N={n} failed: {done.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def _top(small: str, large: str, runs: int, limit: int) -> None:
    old = tracemalloc.Snapshot.load(small)
    new = tracemalloc.Snapshot.load(large)
    stats = new.compare_to(old, "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"  traced growth: {total / runs / 1024:.1f} KB a run")
    for s in stats[:limit]:
        frame = s.traceback[0]
        where = f"{frame.filename.split('site-packages/')[-1].split('src/')[-1]}:{frame.lineno}"
        print(f"  {s.size_diff / runs:8.0f} B  {s.count_diff / runs:6.1f} obj  {where}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.concurrency_memory")
    parser.add_argument("--n", default="200,1000", help="two run counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--stores", default="baseline,sqlite,postgres")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--trace", action="store_true", help="tracemalloc snapshots too")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    small, large = (int(x) for x in args.n.split(","))
    with tempfile.TemporaryDirectory(prefix="wakeful-mem-") as tmp:
        for kind in args.stores.split(","):
            got = {}
            for n in (small, large):
                trace = f"{tmp}/{kind}-{n}.snap" if args.trace and kind != "baseline" else ""
                if kind == "postgres":
                    db = Database(args.dsn, f"wakeful_mem_{os.getpid()}").create()
                    try:
                        got[n] = _measure(kind, db.dsn, n, args.seconds, trace)
                    finally:
                        db.drop()
                else:
                    url = f"sqlite:///{tmp}/{kind}-{n}.db"
                    got[n] = _measure(kind, url, n, args.seconds, trace)
            per_run = (got[large]["mid"] - got[small]["mid"]) / (large - small)
            print(
                f"{kind}: loaded {got[large]['loaded'] / 1024:.1f} MB, mid-stream "
                f"{got[small]['mid'] / 1024:.1f} MB at N={small}, "
                f"{got[large]['mid'] / 1024:.1f} MB at N={large}: {per_run:.1f} KB a run",
                flush=True,
            )
            if args.trace and kind != "baseline":
                _top(
                    f"{tmp}/{kind}-{small}.snap",
                    f"{tmp}/{kind}-{large}.snap",
                    large - small,
                    args.top,
                )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        kind, url, n, seconds, trace = sys.argv[2:7]
        print(json.dumps(asyncio.run(_child(kind, url, int(n), float(seconds), trace))))
    else:
        main(sys.argv[1:])
