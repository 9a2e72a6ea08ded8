"""Rate-limit accuracy (issue 39): how many requests a provider sees from two worker processes
sharing one ``RateLimit(requests_per_minute=...)`` in a PostgreSQL store.

Run ``python -m benchmarks.flow_control [--dsn URL] [--rpm 120] [--seconds 60] [--rounds 1]``.
A loopback OpenAI-compatible server (in this process, a thread) answers every chat request at
once with a short streamed reply and records when it arrived. Two worker processes (``--child``)
each keep ``--runs`` agent runs going on threads of their own, every model call limited by the
same key, for ``--seconds`` plus a margin. Measured: the requests the server saw in the
``--seconds`` window starting at the first one, against the budget ``rpm * seconds / 60``
(target 1.0 +- 5 %; the bucket's one second of burst adds 2 requests to a 60 s window at 120
rpm, +1.7 %). Then the cost of a limit that is never reached: agent runs per second in this
process with and without it, in interleaved pairs of ``--overhead-runs`` runs, the figure the
median of the pairs' ratios (target >= 0.9x); the limit's store calls per model call and
their time; and the store time per model call on one connection of a take that folds the
reconcile against a take and a reconcile statement (decision 0047).

Concurrency keys (``--key-runs`` dispatches per sample, 0: skip): the no-op drain of
``benchmarks.dispatch`` (one in-process worker, 10 runs at a time, PostgreSQL) with every
dispatch carrying one per-model key whose limit (100,000) is never reached, against no key
(target >= 0.9x); and the submission rate of the same dispatches, which with a key
serialise on the key's row (reported, no target).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, rounds_argument

ROOT = Path(__file__).resolve().parent.parent
KEY = "bench:chat"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


REPLY = b"".join(
    [
        _chunk({"role": "assistant", "content": "ok"}),
        _chunk({}, "stop"),
        b'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}\n\n',
        b"data: [DONE]\n\n",
    ]
)


class Provider:
    """The loopback chat server: answers at once, records arrival times (monotonic)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        lock = threading.Lock()
        arrivals = self.arrivals

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    arrivals.append(time.monotonic())
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(REPLY)))
                self.end_headers()
                self.wfile.write(REPLY)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


async def _child(store_url: str, base_url: str, rpm: float, seconds: float, runs: int) -> None:
    """One worker process: ``runs`` agent runs at a time until ``seconds`` have passed."""
    from wakeful import open_store
    from wakeful.agent import Agent
    from wakeful.limits import RateLimit
    from wakeful.providers import OpenAIChat
    from wakeful.runtime import Runtime

    limit = RateLimit(key=KEY, requests_per_minute=rpm)
    deadline = time.monotonic() + seconds
    async with open_store(store_url) as store:
        model = OpenAIChat("bench", base_url=base_url, limits=[limit])
        agent = Agent("bench", model)
        runtime = Runtime(store)
        prefix = f"p{id(store):x}"

        async def loop(lane: int) -> None:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                await agent.run(runtime, f"{prefix}-{lane}-{n}", "hi")

        with contextlib.suppress(TimeoutError):  # runs still waiting for the bucket at the end
            await asyncio.wait_for(asyncio.gather(*(loop(i) for i in range(runs))), seconds + 30)
        await model.aclose()


class _Timed:
    """Counts the rate-limit store calls and their wall time (the cost a limit adds)."""

    def __init__(self, store: Any) -> None:
        self.calls = 0
        self.seconds = 0.0
        for name in ("take_limit", "reconcile_limit"):
            setattr(store, name, self._wrap(getattr(store, name)))

    def _wrap(self, method: Any) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        return timed


async def _paired(
    store_url: str, base_url: str, pairs: int, batch: int
) -> tuple[dict[bool, list[float]], list[float], _Timed]:
    """Agent runs per second, 8 at a time, on one store: batches of ``batch`` runs of an
    agent whose provider has a limit that is never reached, alternating with batches of the
    same agent without it (the order alternating too). The rates of each kind, each pair's
    ratio (limited / not), and the limit's store calls counted and timed."""
    from wakeful import open_store
    from wakeful.agent import Agent
    from wakeful.limits import RateLimit
    from wakeful.providers import OpenAIChat
    from wakeful.runtime import Runtime

    roomy = RateLimit(key=KEY, requests_per_minute=1e7, tokens_per_minute=1e10)
    rates: dict[bool, list[float]] = {True: [], False: []}
    ratios: list[float] = []
    async with open_store(store_url) as store:
        timed = _Timed(store)
        models = {on: OpenAIChat("bench", base_url=base_url, limits=[roomy] if on else None)
                  for on in (True, False)}  # fmt: skip
        agents = {on: Agent("bench", model) for on, model in models.items()}
        runtime = Runtime(store)

        async def rate(limited: bool, runs: int) -> float:
            queue = list(range(runs))

            async def lane() -> None:
                while queue:
                    thread = f"{limited:d}-{queue.pop()}-{time.monotonic_ns()}"
                    await agents[limited].run(runtime, thread, "hi")

            started = time.perf_counter()
            await asyncio.gather(*(lane() for _ in range(8)))
            return runs / (time.perf_counter() - started)

        await rate(True, 16)  # the key's row, connections and code paths warm
        await rate(False, 16)
        timed.calls, timed.seconds = 0, 0.0
        for pair in range(pairs):
            found = {}
            for limited in (pair % 2 == 0, pair % 2 != 0):
                found[limited] = await rate(limited, batch)
                rates[limited].append(found[limited])
            ratios.append(found[True] / found[False])
        for model in models.values():
            await model.aclose()
    return rates, ratios, timed


async def _statements(store_url: str, batches: int, size: int = 100) -> dict[bool, list[float]]:
    """Milliseconds of store time per model call on one connection, in alternating batches:
    a take folding the previous call's reconcile (``True``) against a take and then a
    reconcile statement (``False``, how calls were limited before the fold)."""
    from wakeful import open_store
    from wakeful.limits import LimitWaiter, RateLimit
    from wakeful.store.contract import RateLimitStore

    roomy = RateLimit(key=KEY, requests_per_minute=1e9, tokens_per_minute=1e12)
    waiter = LimitWaiter(run_id="bench-run", thread_id="bench-thread")
    found: dict[bool, list[float]] = {True: [], False: []}
    async with open_store(store_url) as store:
        assert isinstance(store, RateLimitStore)
        for batch in range(batches):
            for folded in (batch % 2 == 0, batch % 2 != 0):
                started = time.perf_counter()
                for _ in range(size):
                    if folded:
                        await store.take_limit(roomy, 1, 100, settle=-40, waiter=waiter)
                    else:
                        await store.take_limit(roomy, 1, 100, waiter=waiter)
                        await store.reconcile_limit(KEY, -40)
                found[folded].append((time.perf_counter() - started) / size * 1000)
    return found


def _round(dsn: str, rpm: float, seconds: float, runs: int) -> float:
    """Requests the provider saw in the first ``seconds`` of traffic."""
    provider = Provider()
    try:
        argv = [sys.executable, "-m", "benchmarks.flow_control", "--child", dsn, provider.base_url]
        options = ["--rpm", str(rpm), "--seconds", str(seconds + 2), "--runs", str(runs)]
        children = [subprocess.Popen([*argv, *options], cwd=ROOT) for _ in range(2)]
        for child in children:
            child.wait(timeout=seconds + 90)
    finally:
        provider.close()
    arrivals = sorted(provider.arrivals)
    if not arrivals:
        return 0.0
    first = arrivals[0]
    return float(sum(1 for t in arrivals if t - first < seconds))


def run(args: argparse.Namespace) -> list[Result]:
    out = Collector("flow_control")
    budget = args.rpm * args.seconds / 60
    samples = []
    for r in range(args.rounds):
        db = Database(args.dsn, f"wakeful_bench_flow_{r}").create()
        try:
            seen = _round(db.dsn, args.rpm, args.seconds, args.runs)
        finally:
            db.drop()
        samples.append(seen)
        print(f"  round {r + 1}: {seen:.0f} requests in {args.seconds:g} s (budget {budget:g})")
    out.add(
        f"requests seen at {args.rpm:g} rpm over {args.seconds:g} s, two workers",
        samples,
        "requests",
        anchor="budget (rpm x minutes)",
        anchor_samples=budget,
        target=1.05,
        higher_is_better=False,
        note=f"{args.runs} concurrent runs per worker; target: within +5 % (and -5 %) of budget",
    )
    low = min(samples) / budget if budget else 0.0
    print(f"  lowest round: {low:.3f} of budget (must be >= 0.95)")
    if args.overhead_runs:
        _overhead(args, out)
    if args.key_runs:
        _keys(args, out)
    return out.results


def _overhead(args: argparse.Namespace, out: Collector) -> None:
    """Agent runs per second with a limit configured but never reached, against none: one
    take per model call (one statement on PostgreSQL; it pays the process's pending reconcile
    too), in interleaved pairs of batches (a ratio of medians across rounds would measure
    the shared machine's load between rounds). Then what the limit's store calls cost per
    model call: how many, how long."""
    pairs = 4 * max(args.rounds, 3)
    db = Database(args.dsn, "wakeful_bench_flow_overhead").create()
    provider = Provider()
    try:
        rates, ratios, timed = asyncio.run(
            _paired(db.dsn, provider.base_url, pairs, args.overhead_runs)
        )
    finally:
        provider.close()
        db.drop()
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"  limits on {on:6.1f} runs/s, off {off:6.1f} runs/s (medians of {pairs} batches)")
    print(f"  paired ratios: {' '.join(f'{r:.2f}' for r in ratios)}")
    out.add(
        "agent runs/s, a limit configured but not reached",
        ratios,
        "x no limit",
        anchor="no limit, interleaved",
        anchor_samples=1.0,
        target=0.9,
        note=f"{on:,.0f} against {off:,.0f} runs/s; pairs of {args.overhead_runs} runs of one "
        "model call, 8 at a time, PostgreSQL",
    )
    runs = pairs * args.overhead_runs
    db = Database(args.dsn, "wakeful_bench_flow_statements").create()
    try:
        per_call = asyncio.run(_statements(db.dsn, 2 * max(args.rounds, 3)))
    finally:
        db.drop()
    out.add(
        "rate-limit store time per model call, one connection",
        per_call[True],
        "ms",
        anchor="a take, then a reconcile statement",
        anchor_samples=per_call[False],
        higher_is_better=False,
        note="a take that pays the previous call's reconcile (decision 0047); batches of 100",
    )
    out.add(
        "rate-limit store calls per model call",
        [timed.calls / runs],
        "calls",
        note="take_limit (and reconcile_limit, before the reconcile was folded into the take)",
    )
    out.add(
        "rate-limit store time per model call",
        [timed.seconds / runs * 1000],
        "ms",
        higher_is_better=False,
        note="wall time in the limit's store calls, 8 runs at a time",
    )


async def _keyed_drain(store_url: str, keyed: bool, n: int) -> tuple[float, float]:
    """(submissions/s, dispatches drained/s) of ``n`` no-op runs, with one key or none."""
    from benchmarks.dispatch import _drained, _noop_registry
    from wakeful import open_store
    from wakeful.fleet import LocalWake, Worker, submit
    from wakeful.runtime import ClaimPolicy

    tag = f"{'k' if keyed else 'u'}{time.monotonic_ns()}"
    key = "model:bench" if keyed else None
    limit = 100_000 if keyed else None
    async with open_store(store_url) as store:
        started = time.perf_counter()
        ids = list(range(n))

        async def lane() -> None:
            while ids:
                i = ids.pop()
                await submit(
                    store, f"{tag}-{i}", "noop", None, dispatch_id=f"{tag}-{i}",
                    concurrency_key=key, concurrency_limit=limit,
                )  # fmt: skip

        await asyncio.gather(*(lane() for _ in range(8)))
        submitted = n / (time.perf_counter() - started)
        counter = [0]
        worker = Worker(
            store, _noop_registry(counter), concurrency=10,
            claims=ClaimPolicy(ttl=30, renew_every=10), wake=LocalWake(), poll_interval=0.5,
            relay=False,
        )  # fmt: skip
        started = time.perf_counter()
        running = asyncio.create_task(worker.run())
        await _drained(worker)
        elapsed = time.perf_counter() - started
        await worker.stop(grace=5)
        await running
        if counter[0] != n:
            raise SystemExit(f"ran {counter[0]} of {n} dispatches")
    return submitted, n / elapsed


def _keys(args: argparse.Namespace, out: Collector) -> None:
    """The drain with a concurrency key configured but never reached, against none."""
    drains: dict[bool, list[float]] = {True: [], False: []}
    submits: dict[bool, list[float]] = {True: [], False: []}
    for r in range(max(args.rounds, 3)):
        for keyed in (r % 2 == 0, r % 2 != 0):  # alternate which goes first
            db = Database(args.dsn, "wakeful_bench_flow_keys").create()
            try:
                sub, drain = asyncio.run(_keyed_drain(db.dsn, keyed, args.key_runs))
            finally:
                db.drop()
            drains[keyed].append(drain)
            submits[keyed].append(sub)
            print(f"  round {r + 1}: key {'on ' if keyed else 'off'} submit {sub:6.0f}/s, "
                  f"drain {drain:6.0f}/s")  # fmt: skip
    out.add(
        "dispatches drained/s, a concurrency key configured but not reached",
        drains[True],
        "dispatches/s",
        anchor="no key",
        anchor_samples=drains[False],
        target=0.9,
        note=f"{args.key_runs} no-op runs, one worker x 10, one per-model key, PostgreSQL",
    )
    out.add(
        "submissions/s of one per-model concurrency key",
        submits[True],
        "submissions/s",
        anchor="no key",
        anchor_samples=submits[False],
        note="8 concurrent submitters; with a key each enqueue locks the key's row",
    )


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flow_control")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server to benchmark (admin DSN)")
    parser.add_argument("--rpm", type=float, default=120.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=4, help="concurrent runs per worker")
    parser.add_argument(
        "--overhead-runs", type=int, default=100, help="runs per overhead batch (0: skip)"
    )
    parser.add_argument(
        "--key-runs", type=int, default=1000, help="dispatches per key sample (0: skip)"
    )
    parser.add_argument(
        "--child", nargs=2, metavar=("STORE_URL", "BASE_URL"), help=argparse.SUPPRESS
    )
    rounds_argument(parser, default=1)
    args = parser.parse_args(argv if argv is not None else [])
    if args.child:
        store_url, base_url = args.child
        asyncio.run(_child(store_url, base_url, args.rpm, args.seconds, args.runs))
        return []
    return run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
