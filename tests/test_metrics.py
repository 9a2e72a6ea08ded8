"""Worker metrics and the worker's /metrics endpoint."""

from __future__ import annotations

import asyncio

import pytest

from tests.runtime_support import eventually
from wakeful import ManualClock
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.metrics import Metrics, serve_metrics
from wakeful.runtime import START, Graph
from wakeful.store.memory import MemoryStore


@pytest.mark.asyncio
async def test_a_worker_counts_leases_and_settles_and_serves_them() -> None:
    store = MemoryStore(ManualClock())
    graph = Graph({"x": None}, name="g").node("n", lambda s: {"x": 1}).edge(START, "n").compile()
    wake = LocalWake()
    worker = Worker(store, Registry().add("g", graph), wake=wake, poll_interval=0.05)
    running = asyncio.create_task(worker.run())
    await submit(store, "t", "g", {}, dispatch_id="d1", wake=wake)
    await eventually(lambda: worker.metrics.settles.value(outcome="done") == 1)
    assert worker.metrics.leases.value() == 1
    server = await serve_metrics(worker.metrics, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        await writer.drain()
        response = (await reader.read()).decode()
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
        await worker.stop(2)
        await running
    assert response.startswith("HTTP/1.0 200 OK")
    assert 'wakeful_settles_total{outcome="done"} 1' in response
    assert "wakeful_leases_total 1" in response


def test_render_is_prometheus_text() -> None:
    metrics = Metrics()
    metrics.retries.inc()
    text = metrics.render()
    assert "# TYPE wakeful_retries_total counter" in text and "wakeful_retries_total 1" in text
