"""The console's first view on loopback with many threads in the store.

Run ``python -m benchmarks.console [--rounds 3] [--threads 100000]``.

A SQLite store is filled with ``--threads`` committed threads of two tenants (each one
checkpoint, one event and one message, written through the public store API, 500 commits in
flight at a time) and served by ``wakeful serve``'s app on 127.0.0.1. Debian's Chromium
(Playwright, ``executable_path``) opens ``/console/#/threads`` in a fresh browser context
each time (cold HTTP cache; the token and its identity already in the tab's session
storage, as after a sign-in: a reload) and the page
marks ``wakeful:threads-shown`` once the first page of 50 threads is on screen; the mark's
time since navigation start is the figure (target: under 300 ms). Also reported: the
operator's and a tenant's ``GET /v1/threads?limit=50`` alone, and the page weight (every
asset the first view loads).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import Collector, Result, rounds_argument
from wakeful import open_store
from wakeful.records import Checkpoint, Commit, EventDraft, Message

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LIMIT_MS = 300.0
TOKENS = {"bench-operator-1": "*", "bench-alpha-001": "alpha", "bench-beta-0001": "beta"}
IN_FLIGHT = 500
IDENTITY = '{"tenant": null, "operator": true, "development": false}'


async def fill(url: str, threads: int) -> float:
    """Commit ``threads`` threads; returns the seconds it took."""
    started = time.perf_counter()
    async with open_store(url) as store:

        async def one(i: int) -> None:
            thread = f"thread-{i:07d}"
            tenant = "alpha" if i % 2 else "beta"
            run = f"run-{i}"
            checkpoint = Checkpoint(
                id=f"{run}-c1", parent=None, run_id=run, status="completed",
                state={"total": i, "numbers": [i, i + 1]}, created_at=datetime.now(UTC),
                tenant=tenant, metadata={"graph": "sorter"},
            )  # fmt: skip
            claim = await store.claim(thread, "bench", 30, tenant=tenant)
            commit = Commit(
                token=claim.token,
                checkpoint=checkpoint,
                events=(EventDraft(type="run.completed", run_id=run),),
                messages=(Message(id=f"m-{i}", role="user", content=f"hello {i}"),),
                release=True,
            )
            await store.commit(thread, commit)

        for start in range(0, threads, IN_FLIGHT):
            await asyncio.gather(*(one(i) for i in range(start, min(start + IN_FLIGHT, threads))))
    return time.perf_counter() - started


@contextmanager
def serving(url: str) -> Iterator[str]:
    """The API (with the console) over ``url`` on an ephemeral loopback port, in a thread."""
    from wakeful.server.runner import run_server

    ready: dict[str, Any] = {}
    stop_holder: dict[str, Any] = {}
    started = threading.Event()

    def run() -> None:
        async def main() -> None:
            stop = asyncio.Event()
            stop_holder["stop"], stop_holder["loop"] = stop, asyncio.get_running_loop()

            def on_ready(host: str, port: int) -> None:
                ready["url"] = f"http://{host}:{port}"
                started.set()

            await run_server(
                url, port=0, tokens=TOKENS, log_level="warning", on_ready=on_ready, stop=stop
            )

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not started.wait(60):
        raise RuntimeError("the server did not start")
    try:
        yield str(ready["url"])
    finally:
        stop_holder["loop"].call_soon_threadsafe(stop_holder["stop"].set)
        thread.join(30)


def api_ms(base: str, token: str, rounds: int) -> list[float]:
    samples = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as client:
        client.get("/v1/threads", params={"limit": 50}).raise_for_status()  # warm
        for _ in range(rounds * 5):
            t = time.perf_counter()
            client.get("/v1/threads", params={"limit": 50}).raise_for_status()
            samples.append((time.perf_counter() - t) * 1000)
    return samples


def first_view_ms(base: str, token: str, rounds: int) -> tuple[list[float], int]:
    from playwright.sync_api import sync_playwright

    samples: list[float] = []
    weight = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for i in range(rounds + 1):  # the first load warms the server, not measured
                context = browser.new_context()
                context.add_init_script(  # a tab that signed in before (a reload)
                    f"sessionStorage.setItem('wakeful.console.token', {token!r});"
                    f"sessionStorage.setItem('wakeful.console.identity', {IDENTITY!r})"
                )
                page = context.new_page()
                sizes: list[int] = []

                def count(response: Any, into: list[int] = sizes) -> None:
                    into.append(len(response.body()) if response.ok else 0)

                page.on("response", count)
                page.goto(f"{base}/console/#/threads")
                page.wait_for_selector("tr[data-thread]")
                mark = page.evaluate(
                    "performance.getEntriesByName('wakeful:threads-shown')[0].startTime"
                )
                if i:
                    samples.append(float(mark))
                    weight = sum(sizes)
                context.close()
        finally:
            browser.close()
    return samples, weight


def main(argv: list[str]) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.console")
    rounds_argument(parser)
    parser.add_argument("--threads", type=int, default=100_000)
    args = parser.parse_args(argv)
    out = Collector("console")
    if shutil.which(CHROMIUM) is None:
        out.add("first view", [], "ms", skipped=f"{CHROMIUM} is missing")
        return out.results
    tmp = Path(tempfile.mkdtemp(prefix="wakeful-console-bench-"))
    try:
        url = f"sqlite:///{tmp / 'console.db'}"
        seconds = asyncio.run(fill(url, args.threads))
        print(f"filled {args.threads:,} threads in {seconds:.1f} s")
        with serving(url) as base:
            operator = api_ms(base, "bench-operator-1", args.rounds)
            tenant = api_ms(base, "bench-alpha-001", args.rounds)
            views, weight = first_view_ms(base, "bench-operator-1", args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = f"{args.threads // 1000}k threads, SQLite"
    out.add(
        f"first view: threads page on screen ({n})",
        views,
        "ms",
        higher_is_better=False,
        anchor="limit",
        anchor_samples=LIMIT_MS,
        target=1.0,
        note=f"cold browser cache, page weight {weight / 1024:.0f} KiB",
    )
    out.add(f"GET /v1/threads?limit=50, operator ({n})", operator, "ms", higher_is_better=False)
    out.add(f"GET /v1/threads?limit=50, tenant ({n})", tenant, "ms", higher_is_better=False)
    for r in out.results:
        print(f"{r.name:<60} {r.value:8.1f} {r.unit}  {r.note}")
    print(f"(medians of {args.rounds} rounds; api: {statistics.median(operator):.1f} ms)")
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
