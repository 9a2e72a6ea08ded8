"""What a webhook costs a run, and how late it arrives (issue 43).

Run ``python -m benchmarks.webhooks [--n 200] [--concurrency 8] [--rounds 3]``.

One in-process worker over a fresh SQLite file runs ``--n`` one-node runs, submitted at
once, first without a webhook and then each with a webhook to a loopback receiver that
answers 200 (a threaded ``http.server``). Figures:

- runs/s to the last run ended, without webhooks, and with webhooks to the last webhook
  received: a webhook adds to each run one outbox entry in its ending commit, the relay's
  inbox append and dispatch, a lease, one POST and one record commit with its settle;
- the delivery lag, from a run's ending checkpoint (its ``created_at``) to the receiver's
  clock when the POST arrived: p50 and p99 (the relay steps every 0.5 s, so the lag is
  mostly that wait).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any, TypedDict

from benchmarks.common import Collector, Result
from wakeful import open_store
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.fleet.webhook_signing import new_secret
from wakeful.fleet.webhooks import WebhookConfig
from wakeful.runtime import START, ClaimPolicy, Graph, append


class State(TypedDict):
    log: Annotated[list[str], append]


def _echo(state: dict[str, Any]) -> dict[str, Any]:
    return {"log": ["echoed"]}


class _Receiver:
    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.lock = threading.Lock()
        got = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                ended = json.loads(body)["data"]["checkpoint_id"]
                with got.lock:
                    got.arrivals.setdefault(ended, time.time())
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _round(n: int, concurrency: int, receiver: _Receiver | None) -> tuple[float, list[float]]:
    """Seconds from the first submit to the last run ended (with a receiver: to the last
    webhook received), and the delivery lags in seconds."""
    registry = Registry().add(
        "echo", Graph(State, name="echo").node("e", _echo).edge(START, "e").compile()
    )
    with tempfile.TemporaryDirectory() as tmp:
        async with open_store(f"sqlite:///{Path(tmp) / 'bench.db'}") as store:
            wake = LocalWake()
            config = WebhookConfig(secrets=(new_secret(),), allow_private=True)
            worker = Worker(
                store, registry, concurrency=concurrency, wake=wake, poll_interval=0.05,
                claims=ClaimPolicy(ttl=30, renew_every=10), webhooks=config,
            )  # fmt: skip
            running = asyncio.create_task(worker.run())
            await worker.started()
            url = receiver.url if receiver is not None else None
            start = time.perf_counter()
            for i in range(n):
                await submit(store, f"t{i}", "echo", webhook=url, wake=wake)
            ended: dict[str, datetime] = {}
            waiting = set(range(n))
            for _ in itertools.count():  # the runs' ends, read every 50 ms
                for i in sorted(waiting):
                    snap = await store.read(f"t{i}")
                    if snap and snap.checkpoint and snap.checkpoint.status == "completed":
                        ended[snap.checkpoint.id] = snap.checkpoint.created_at
                        waiting.discard(i)
                if not waiting and (receiver is None or len(receiver.arrivals) >= n):
                    break
                await asyncio.sleep(0.05)
            seconds = time.perf_counter() - start
            await worker.stop(5)
            await running
    lags = []
    if receiver is not None:
        lags = [receiver.arrivals[cp] - at.timestamp() for cp, at in ended.items()]
        receiver.arrivals.clear()
    return seconds, lags


def run(args: argparse.Namespace) -> list[Result]:
    out = Collector("webhooks")
    receiver = _Receiver()
    plain: list[float] = []
    hooked: list[float] = []
    lags: list[float] = []
    try:
        for _ in range(args.rounds):
            seconds, _ = asyncio.run(_round(args.n, args.concurrency, None))
            plain.append(args.n / seconds)
            seconds, lag = asyncio.run(_round(args.n, args.concurrency, receiver))
            hooked.append(args.n / seconds)
            lags += lag
    finally:
        receiver.close()
    lags.sort()
    out.add("runs, sqlite, no webhook", plain, "runs/s")
    out.add(
        "runs, sqlite, each with a webhook delivered",
        hooked,
        "runs/s",
        anchor="the same runs without a webhook",
        anchor_samples=plain,
        target=0.3,
    )
    p50, p99 = statistics.median(lags), lags[max(int(len(lags) * 0.99) - 1, 0)]
    out.add("delivery lag p50 (run ended -> POST received)", p50, "s", higher_is_better=False)
    out.add("delivery lag p99", p99, "s", higher_is_better=False)
    print(
        f"{args.n} runs, concurrency {args.concurrency}: {statistics.median(plain):.0f} runs/s "
        f"without webhooks, {statistics.median(hooked):.0f} runs/s with webhooks delivered; "
        f"lag p50 {p50:.2f} s, p99 {p99:.2f} s",
        flush=True,
    )
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.webhooks")
    parser.add_argument("--n", type=int, default=200, help="runs per round")
    parser.add_argument("--concurrency", type=int, default=8, help="the worker's concurrency")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each")
    args = parser.parse_args(argv if argv is not None else [])
    return run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
