"""Live streaming across real processes: ``wakeful serve`` and ``wakeful worker``
subprocesses over one store (SQLite: no live channel, the stream follows the stream
checkpoints; PostgreSQL: ``NOTIFY``), the OpenAI-compatible test server writing slowly, and
``wakeful.client`` over loopback HTTP.

The worker is SIGKILLed mid-reply and a second one recovers the run; then the server is
SIGKILLed mid-reply and started again on the same port, and the client's stream reconnects
by itself with ``Last-Event-ID``. Either way the client sees deltas before the run ends and
the text it assembles from the deltas is the committed assistant message."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.postgres_support import Databases
from tests.provider_server import ProviderServer, Reply, openai_text
from wakeful.client import Backoff, Client, Frame

pytest_plugins = ["tests.postgres_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
WAKEFUL = str(Path(sys.executable).parent / "wakeful")
DEADLINE = 60.0
WORDS = [f"w{i:02d} " for i in range(60)]
"""The first reply: 60 words, one every 50 ms (3 s), cut by the kill."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _process(args: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [WAKEFUL, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([WAKEFUL, *args], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


async def _healthy(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + DEADLINE
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            try:
                if (await http.get(f"{base}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server never got ready"
            await asyncio.sleep(0.05)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """``(kind, store URL)``: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return "sqlite", f"sqlite:///{tmp_path / 'store.db'}"
    databases: Databases = request.getfixturevalue("pg_databases")
    return "postgres", asyncio.run(databases.clone())


def _live(backend: str) -> list[str]:
    return ["--live", "postgres"] if backend == "postgres" else ["--live", "none"]


async def _streamed_until_end(
    client: Client,
    frames: list[Frame],
    when_text: int,
    act: object,
) -> str:
    """Start the run, stream it to its end; once the assembled text of the reply reaches
    ``when_text`` characters, call ``act`` (once). Returns the run id."""
    stream = client.runs.stream("t1", "writer", "Tell me a story", modes=("events", "messages"))
    acted = False
    async with stream:
        async with asyncio.timeout(DEADLINE):
            async for frame in stream:
                frames.append(frame)
                if frame.event == "messages/delta" and not acted:
                    message = stream.messages.get(frame.data["message_id"])
                    if message is not None and len(message.text) >= when_text:
                        acted = True
                        await act()  # type: ignore[operator]
    assert acted, "the reply ended before the kill"
    assert stream.metadata is not None
    frames.append(Frame("_assembled", stream.messages, None))
    return str(stream.metadata["run_id"])


async def _check(client: Client, frames: list[Frame], *, live: bool) -> None:
    """With a live channel the deltas alone add up to the committed message; without one
    they follow the stream checkpoints, so the deltas are a prefix of it and the tail since
    the last checkpoint comes with ``messages/complete``. Either way nothing is repeated or
    wrong, and the assembled message is the committed one."""
    assembled = frames[-1].data
    messages = (await client.threads.messages("t1"))["messages"]
    replies = [m for m in messages if m["role"] == "assistant"]
    assert len(replies) == 1, "exactly one assistant message was committed"
    committed = replies[0]
    message = assembled.get(committed["id"])
    assert message is not None and message.complete
    assert message.text == committed["content"]
    assert message.streamed_text is not None
    assert committed["content"].startswith(message.streamed_text), message.streamed_text
    if live:
        assert message.streamed_text == committed["content"]
    assert message.gaps == 0
    assert committed["content"].startswith("w00 w01 ") and committed["content"].endswith("The end.")
    names = [f.event for f in frames]
    first_delta = names.index("messages/delta")
    assert first_delta < names.index("message.completed") < names.index("run.completed")
    assert names[-2] == "end"


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_worker_killed_mid_reply_streams_the_whole_reply_once(
    backend: tuple[str, str],
) -> None:
    kind, url = backend
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with ProviderServer() as provider:
        provider.push(Reply(events=openai_text(*WORDS), pace=0.05))
        provider.push(Reply(events=openai_text("The ", "end."), pace=0.05))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
            "WAKEFUL_TEST_PROVIDER": provider.url,
        }
        serve = ["serve", "--store", url, "--port", str(port), *_live(kind)]
        work = ["worker", "--store", url, "--app", "tests.stream_app:registry", "--ttl", "2"]
        work += ["--poll", "0.1", *_live(kind)]
        with _process(serve, env) as server, _process(work, env) as first:
            await _healthy(base, server)
            second: list[subprocess.Popen[bytes]] = []

            async def kill_the_worker() -> None:
                _kill(first)
                second.append(_spawn(work, env))

            frames: list[Frame] = []
            try:
                async with Client(base, backoff=Backoff(initial=0.05, maximum=0.5)) as client:
                    await _streamed_until_end(client, frames, 24, kill_the_worker)
                    await _check(client, frames, live=kind == "postgres")
                    types = [f.event for f in frames]
                    assert "run.recovered" in types or "model.recovered" in types
            finally:
                for proc in second:
                    proc.kill()
                    proc.wait(10)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_stream_reconnects_after_the_server_dies_mid_reply(
    backend: tuple[str, str],
) -> None:
    kind, url = backend
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with ProviderServer() as provider:
        provider.push(Reply(events=openai_text(*WORDS, "The ", "end."), pace=0.08))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
            "WAKEFUL_TEST_PROVIDER": provider.url,
        }
        serve = ["serve", "--store", url, "--port", str(port), *_live(kind)]
        work = ["worker", "--store", url, "--app", "tests.stream_app:registry", "--poll", "0.1"]
        work += _live(kind)
        with _process(work, env), _process(serve, env) as server:
            await _healthy(base, server)
            replaced: list[subprocess.Popen[bytes]] = []

            async def kill_the_server() -> None:
                _kill(server)
                replaced.append(_spawn(serve, env))

            frames: list[Frame] = []
            try:
                async with Client(base, backoff=Backoff(initial=0.05, maximum=0.3)) as client:
                    stream_reconnects = await _reconnecting(client, frames, kill_the_server)
                    assert stream_reconnects >= 1
                    await _check(client, frames, live=kind == "postgres")
            finally:
                for proc in replaced:
                    proc.kill()
                    proc.wait(10)


async def _reconnecting(client: Client, frames: list[Frame], act: object) -> int:
    stream = client.runs.stream("t1", "writer", "Tell me a story", modes=("events", "messages"))
    acted = False
    after_reconnect: int | None = None
    async with stream:
        async with asyncio.timeout(DEADLINE):
            async for frame in stream:
                frames.append(frame)
                if stream.reconnects and after_reconnect is None:
                    after_reconnect = len(frames) - 1
                if frame.event == "messages/delta" and not acted:
                    message = stream.messages.get(frame.data["message_id"])
                    if message is not None and len(message.text) >= 24:
                        acted = True
                        await act()  # type: ignore[operator]
    assert acted and after_reconnect is not None
    resumed = [f.event for f in frames[after_reconnect:]]
    assert "messages/delta" in resumed, "the stream came back before the reply was finished"
    frames.append(Frame("_assembled", stream.messages, None))
    return stream.reconnects
