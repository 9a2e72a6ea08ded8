"""What a client can hold on a wakeful HTTP server (decision 0034): connections that never
finish their request headers are closed after the header timeout, open connections are
capped, and asyncio's accept-error log line is throttled. Real sockets against a real
``run_server`` on loopback."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from wakeful.fleet.serving import ACCEPT_ERROR, accept_throttle
from wakeful.server.runner import run_server

DEADLINE = 20.0
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@asynccontextmanager
async def api(**limits: Any) -> AsyncIterator[int]:
    """``run_server`` over a memory store on an ephemeral port; yields the port."""
    stop = asyncio.Event()
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run_server(
            "memory://",
            port=0,
            tokens={"operator-token-01": "*"},
            log_level="warning",
            stop=stop,
            on_ready=lambda _, p: port.set_result(p),
            **limits,
        )
    )
    either: set[asyncio.Future[Any]] = {task, port}
    await asyncio.wait(either, timeout=DEADLINE, return_when=asyncio.FIRST_COMPLETED)
    assert port.done(), "the server did not start"
    try:
        yield port.result()
    finally:
        stop.set()
        await asyncio.wait_for(task, DEADLINE)


async def healthz(port: int) -> int:
    async with httpx.AsyncClient(timeout=DEADLINE) as client:
        return (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closes the connection within ``within`` seconds (all it sends
    before is read and dropped)."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            chunk = await asyncio.wait_for(reader.read(4096), left)
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        if not chunk:
            return True
    return False


@pytest.mark.asyncio
async def test_connections_that_never_finish_their_headers_are_closed() -> None:
    timeout = 1.0
    async with api(header_timeout=timeout) as port:
        opened = time.monotonic()
        connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(60)]
        for i, (_, writer) in enumerate(connections):
            if i % 3 == 1:
                writer.write(PARTIAL)  # headers started, never finished
            elif i % 3 == 2:  # one request answered, then the next one's headers stall
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + PARTIAL)
            await writer.drain()
        assert await healthz(port) == 200  # a legitimate request still answers
        for reader, _ in connections:
            assert await closed_by_server(reader, timeout + 5.0)
        assert time.monotonic() - opened >= timeout * 0.9  # closed by the timeout, not at once
        for _, writer in connections:
            writer.close()


@pytest.mark.asyncio
async def test_connections_over_the_cap_are_closed_and_the_server_recovers() -> None:
    async with api(header_timeout=30.0, max_connections=4) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_server(reader, 5.0)
        writer.close()
        for held_reader, _ in held:
            assert not await closed_by_server(held_reader, 0.05)
        for _, held_writer in held:
            held_writer.close()
        deadline = time.monotonic() + DEADLINE
        while True:  # the server notices the closed connections, then answers again
            try:
                if await healthz(port) == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not answer after the cap"
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_the_accept_error_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttle = accept_throttle()
    now = [1000.0]
    throttle.clock = lambda: now[0]
    throttle._last, throttle.dropped = None, 0
    loop = asyncio.get_running_loop()
    error = OSError(24, "Too many open files")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(1000):  # what asyncio's accept loop reports when out of descriptors
            loop.call_exception_handler({"message": ACCEPT_ERROR, "exception": error})
        now[0] += 11
        loop.call_exception_handler({"message": ACCEPT_ERROR, "exception": error})
        loop.call_exception_handler({"message": "another asyncio error", "exception": error})
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert len(messages) == 3, len(messages)
    assert messages[0].startswith(ACCEPT_ERROR)
    assert "999 more like it" in messages[1]
    assert messages[2].startswith("another asyncio error")
