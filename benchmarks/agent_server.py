"""The LangGraph API through ``langgraph-sdk``: wakeful against ``langgraph-api`` (issue 44).

The same graph (``benchmarks.agent_server_graph``: one node, a scripted chat model streaming
a 12-token reply) served by

- ``wakeful serve`` over SQLite and over PostgreSQL (a real server process, bearer token),
- ``langgraph dev`` (``langgraph-api`` with its in-memory runtime), from its own virtual
  environment (``--lgapi-venv``, default ``/tmp/lgapi-venv``; create it with
  ``python -m venv /tmp/lgapi-venv && /tmp/lgapi-venv/bin/pip install "langgraph-cli[inmem]"``,
  never into wakeful's own environment).

Each server is driven by the official async client on loopback:

- **runs/s**: ``--clients`` concurrent clients, each creating a thread and calling
  ``runs.wait`` on it ``--runs`` times (a new thread per run, so no run waits for another
  on its thread); the figure is runs completed per second of wall time.
- **time to first token**: ``runs.stream(stream_mode="messages-tuple")`` on a new thread,
  from the request to the first ``messages`` event (the reply's first token), median of
  ``--streams`` runs one after the other; the stream is read to its end each time.

Run: ``python -m benchmarks.agent_server`` (``--rounds``, ``--dsn``). A server that cannot
start is reported as skipped with the reason (the last lines of its log).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import DEFAULT_DSN, Collector, Database, Result, median, rounds_argument

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789"
INPUT: Any = {"messages": [{"role": "user", "content": "hello"}]}
READY_SECONDS = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NotStarted(Exception):
    """A server did not answer its readiness probe; the message is why."""


@contextmanager
def process(args: list[str], env: dict[str, str], probe: str, log: Path) -> Iterator[None]:
    """Run a server until the block ends (SIGTERM, then SIGKILL); ready when ``probe``
    answers 200."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            if proc.poll() is not None:
                raise NotStarted(f"exited {proc.returncode}: {_tail(log)}")
            try:
                if httpx.get(probe, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise NotStarted(f"not ready in {READY_SECONDS:.0f} s: {_tail(log)}")
            time.sleep(0.1)
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(lines[-3:])[-400:]


@contextmanager
def wakeful_server(store: str, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "WAKEFUL_TOKENS": f"{TOKEN}=bench",
    }
    wakeful = str(Path(sys.executable).parent / "wakeful")
    subprocess.run([wakeful, "migrate", "--store", store], env=env, check=True, capture_output=True)
    port = free_port()
    args = [wakeful, "serve", "--store", store, "--port", str(port)]
    args += ["--app", "benchmarks.agent_server_graph:registry"]
    url = f"http://127.0.0.1:{port}"
    with process(args, env, f"{url}/readyz", work / f"wakeful-{port}.log"):
        yield f"{url}/langgraph", {"Authorization": f"Bearer {TOKEN}"}


@contextmanager
def langgraph_dev(venv: Path, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    cli = venv / "bin" / "langgraph"
    if not cli.exists():
        raise NotStarted(f"{cli} is missing (pip install 'langgraph-cli[inmem]' into {venv})")
    config = work / "langgraph.json"
    graph = ROOT / "benchmarks" / "agent_server_graph.py"
    config.write_text(f'{{"dependencies": ["."], "graphs": {{"agent": "{graph}:graph"}}}}')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    port = free_port()
    args = [str(cli), "dev", "--port", str(port), "--no-browser", "--no-reload"]
    args += ["--config", str(config)]
    url = f"http://127.0.0.1:{port}"
    with process(args, env, f"{url}/ok", work / f"langgraph-dev-{port}.log"):
        yield url, {}


async def throughput(url: str, headers: dict[str, str], clients: int, runs: int) -> float:
    from langgraph_sdk import get_client

    sdk = get_client(url=url, headers=headers)

    async def one_client() -> None:
        for _ in range(runs):
            thread = await sdk.threads.create()
            result: Any = await sdk.runs.wait(thread["thread_id"], "agent", input=INPUT)
            assert result["messages"][-1]["type"] == "ai", result

    try:
        await one_client()  # warm up: imports, the graph's first compile, connections
        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        return clients * runs / (time.perf_counter() - start)
    finally:
        await sdk.aclose()


async def first_tokens(url: str, headers: dict[str, str], streams: int) -> list[float]:
    """Milliseconds from each stream's request to its first ``messages`` event."""
    from langgraph_sdk import get_client

    sdk = get_client(url=url, headers=headers)
    samples = []
    try:
        for i in range(streams + 1):
            thread = await sdk.threads.create()
            start = time.perf_counter()
            first: float | None = None
            tokens = 0
            async for part in sdk.runs.stream(
                thread["thread_id"], "agent", input=INPUT, stream_mode="messages-tuple"
            ):
                if part.event == "messages":
                    tokens += 1
                    if first is None:
                        first = (time.perf_counter() - start) * 1000
            assert first is not None and tokens > 1, f"no streamed tokens ({tokens})"
            if i > 0:  # the first is a warm-up
                samples.append(first)
    finally:
        await sdk.aclose()
    return samples


def measure_server(url: str, headers: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    runs_per_s = asyncio.run(throughput(url, headers, args.clients, args.runs))
    ttft = asyncio.run(first_tokens(url, headers, args.streams))
    return {"runs_per_s": runs_per_s, "ttft_ms": median(ttft)}


def measure(args: argparse.Namespace) -> list[Result]:
    figures: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="agent-server-") as tmp:
        work = Path(tmp)
        for round_ in range(args.rounds):
            database = Database(args.dsn, f"wakeful_bench_agent_{uuid.uuid4().hex[:8]}")
            servers: list[tuple[str, Any]] = [
                ("wakeful, SQLite", lambda: wakeful_server(f"sqlite:///{work / 'a.db'}", work)),
                ("wakeful, PostgreSQL", lambda db=database: wakeful_server(db.create().dsn, work)),
                ("langgraph-api in-memory", lambda: langgraph_dev(args.lgapi_venv, work)),
            ]
            try:
                for name, start in servers:
                    if name in skipped:
                        continue
                    try:
                        with start() as (url, headers):
                            figures.setdefault(name, []).append(measure_server(url, headers, args))
                    except (NotStarted, subprocess.CalledProcessError) as exc:
                        skipped[name] = str(exc)
                    print(f"round {round_ + 1}: {name}: {figures.get(name, ['-'])[-1]}")
            finally:
                database.drop()
            (work / "a.db").unlink(missing_ok=True)
    return results(figures, skipped, args)


def results(
    figures: dict[str, list[dict[str, Any]]], skipped: dict[str, str], args: argparse.Namespace
) -> list[Result]:
    out = Collector("agent_server")
    anchor_name = "langgraph-api in-memory"
    anchor = figures.get(anchor_name)
    shape = f"{args.clients} clients x {args.runs} runs.wait"
    for name in ("wakeful, SQLite", "wakeful, PostgreSQL", anchor_name):
        if name not in figures:
            out.skip(f"{name}, runs/s", "runs/s", skipped.get(name, "not run"))
            continue
        own = figures[name]
        is_anchor = name == anchor_name
        out.add(
            f"{name}, runs/s ({shape})",
            [f["runs_per_s"] for f in own],
            "runs/s",
            anchor=None if is_anchor or not anchor else anchor_name,
            anchor_samples=None if is_anchor or not anchor else [f["runs_per_s"] for f in anchor],
        )
        out.add(
            f"{name}, time to first token (messages-tuple)",
            [f["ttft_ms"] for f in own],
            "ms",
            higher_is_better=False,
            anchor=None if is_anchor or not anchor else anchor_name,
            anchor_samples=None if is_anchor or not anchor else [f["ttft_ms"] for f in anchor],
        )
    return out.results


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent_server")
    rounds_argument(parser)
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--runs", type=int, default=10, help="runs per client")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--lgapi-venv", type=Path, default=Path("/tmp/lgapi-venv"))
    args = parser.parse_args(argv)
    found = measure(args)
    for r in found:
        if r.skipped:
            print(f"{r.name}: skipped: {r.skipped}")
            continue
        ratio = f"  ({r.ratio:.2f}x {r.anchor})" if r.ratio is not None else ""
        print(f"{r.name}: {r.value:,.1f} {r.unit}{ratio}")
    return found


if __name__ == "__main__":
    main()
