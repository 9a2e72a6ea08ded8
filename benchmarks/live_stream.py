"""Live streaming (issue 19): delta latency from the provider's chunk to the client's receipt,
p50 and p99, through each transport at 1,000 deltas/s; and one server holding 1,000
concurrent SSE clients on one thread (its RSS).

Latency: an agent whose provider yields 4-character deltas at ``RATE`` per second runs in
this process on a SQLite store, publishing on the transport; the API (uvicorn, loopback) and
one ``wakeful.client`` stream run in the same event loop. A delta's latency is the time from
its ``yield`` to the client frame that completes it. Transports: ``local`` (same process),
``postgres`` (``NOTIFY`` through the server at ``--dsn``), ``nats`` (``--nats``), and
``checkpoint`` (no live channel: the server follows the stream checkpoints). Targets: p99
<= 50 ms with a live channel, <= the checkpoint interval (0.5 s) + 50 ms without.

Clients: ``wakeful serve`` in a subprocess over a SQLite file; ``--clients`` SSE clients
(one httpx client, one connection each) stream one thread while this process commits
``EVENTS`` events to it; reported: the server's RSS before and with the clients connected,
and that every client got every event.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import DEFAULT_DSN, Collector, Result, rounds_argument
from wakeful import open_store
from wakeful.agent import Agent
from wakeful.client import Client
from wakeful.fleet import LocalWake, Registry, Worker
from wakeful.fleet.live import LiveChannel, LocalLive
from wakeful.providers.base import ModelRequest, StreamEnd, StreamItem, TextDelta, Usage
from wakeful.records import Commit, EventDraft
from wakeful.server.app import create_app
from wakeful.server.runner import Server

RATE = 1000.0
DELTAS = 2000
EVENTS = 200
CHECKPOINT_INTERVAL = 0.5


class Paced:
    """``DELTAS`` deltas of 4 characters at ``RATE`` per second; records when each left."""

    model = "paced"

    def __init__(self) -> None:
        self.sent: list[float] = []

    async def _stream(self) -> AsyncIterator[StreamItem]:
        start = time.perf_counter()
        for i in range(DELTAS):
            ahead = start + i / RATE - time.perf_counter()
            if ahead > 0.0005:
                await asyncio.sleep(ahead)
            self.sent.append(time.perf_counter())
            yield TextDelta(f"{i % 1000:03d} ")
        yield StreamEnd("end_turn", Usage(1, DELTAS))

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._stream()


async def _serve(app: Any) -> tuple[Server, asyncio.Task[None]]:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = Server(config)
    task = asyncio.create_task(server.serve())
    await server.ready.wait()
    return server, task


async def latencies(url: str, channel: LiveChannel | None) -> list[float]:
    """Per-delta latency in seconds through ``channel`` (``None``: checkpoints only)."""
    provider = Paced()
    async with open_store(url) as store:
        registry = Registry().add("bench", Agent("bench", provider))
        wake = LocalWake()
        worker = Worker(store, registry, wake=wake, poll_interval=0.05, live=channel)
        running = asyncio.create_task(worker.run())
        server, serving = await _serve(create_app(store, registry, wake=wake, live=channel))
        got: list[float] = []
        try:
            async with Client(f"http://127.0.0.1:{server.port}") as client:
                stream = client.runs.stream("t", "bench", "go", modes=("messages",))
                async with stream:
                    async for frame in stream:
                        if frame.event != "messages/delta":
                            continue
                        now = time.perf_counter()
                        end = (frame.data["offset"] + len(frame.data["text"])) // 4
                        got.extend(now - provider.sent[i] for i in range(len(got), end))
        finally:
            server.should_exit = True
            await serving
            await worker.stop(5)
            await running
        return got


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _channel(kind: str, dsn: str, nats: str) -> LiveChannel | None:
    if kind == "local":
        return LocalLive()
    if kind == "postgres":
        from wakeful.fleet.pglive import PostgresLive

        return PostgresLive(dsn)
    if kind == "nats":
        from wakeful.fleet.natslive import NatsLive

        return NatsLive(nats)
    return None


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    wakeful = str(Path(sys.executable).parent / "wakeful")
    return subprocess.Popen(
        [wakeful, "serve", "--store", url, "--port", str(port)],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


async def fan_out(root: Path, clients: int) -> tuple[int, int, int]:
    """(RSS KiB idle, RSS KiB with the clients, clients that got every event)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    url = f"sqlite:///{root / 'fan.db'}"
    async with open_store(url) as store:
        claim = await store.claim("t", "bench", 60)
        await store.commit("t", Commit(token=claim.token, events=(EventDraft(type="opened"),)))
        server = _start_server(url, port)
        try:
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(
                base_url=base, timeout=httpx.Timeout(60, read=None),
                limits=httpx.Limits(max_connections=clients + 10),
            ) as http:  # fmt: skip
                for _ in range(300):
                    try:
                        if (await http.get("/readyz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await asyncio.sleep(0.1)
                idle = _rss_kib(server.pid)
                connected = asyncio.Semaphore(0)

                async def one() -> int:
                    headers = {"Last-Event-ID": "1"}
                    path = "/v1/threads/t/stream?modes=events"
                    seen = 0
                    async with http.stream("GET", path, headers=headers) as response:
                        connected.release()
                        async for line in response.aiter_lines():
                            if line.startswith("event: "):
                                seen += 1
                                if seen == EVENTS:
                                    return seen
                    return seen

                readers = [asyncio.create_task(one()) for _ in range(clients)]
                for _ in range(clients):
                    await connected.acquire()
                await asyncio.sleep(1.0)
                for i in range(EVENTS):
                    draft = EventDraft(type=f"e{i}")
                    await store.commit("t", Commit(token=claim.token, events=(draft,)))
                done = await asyncio.gather(*readers)
                loaded = _rss_kib(server.pid)
                return idle, loaded, sum(1 for n in done if n == EVENTS)
        finally:
            server.kill()
            server.wait(10)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.live_stream")
    rounds_argument(parser, default=1)
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--transports", default="local,postgres,nats,checkpoint")
    args = parser.parse_args(argv if argv is not None else [])
    out = Collector("live_stream")
    print(f"{'transport':<11} {'p50 ms':>8} {'p99 ms':>8}   ({DELTAS} deltas at {RATE:,.0f}/s)")
    for kind in args.transports.split(","):
        p50s, p99s = [], []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:

                async def measure(kind: str = kind, tmp: str = tmp) -> list[float]:
                    channel = await _channel(kind, args.dsn, args.nats)
                    try:
                        return await latencies(f"sqlite:///{tmp}/s.db", channel)
                    finally:
                        if channel is not None:
                            await channel.close()

                values = asyncio.run(measure())
            p50s.append(1000 * _percentile(values, 0.5))
            p99s.append(1000 * _percentile(values, 0.99))
        limit = 50.0 if kind != "checkpoint" else 1000 * CHECKPOINT_INTERVAL + 50.0
        out.add(f"delta latency p50 ({kind})", p50s, "ms", higher_is_better=False)
        out.add(
            f"delta latency p99 ({kind})", p99s, "ms", higher_is_better=False,
            anchor="limit", anchor_samples=limit, target=1.0,
        )  # fmt: skip
        print(f"{kind:<11} {statistics.median(p50s):>8.1f} {statistics.median(p99s):>8.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        idle, loaded, complete = asyncio.run(fan_out(Path(tmp), args.clients))
    out.add(
        f"server RSS with {args.clients} SSE clients", loaded / 1024, "MiB",
        higher_is_better=False, note=f"idle {idle / 1024:.0f} MiB; {complete} of "
        f"{args.clients} clients got all {EVENTS} events",
    )  # fmt: skip
    print(f"server RSS: idle {idle / 1024:.0f} MiB, {args.clients} clients {loaded / 1024:.0f} "
          f"MiB; {complete}/{args.clients} clients got all {EVENTS} events")  # fmt: skip
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
