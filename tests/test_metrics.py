"""Worker metrics and the worker's /metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.metrics_support import families, sample
from tests.runtime_support import eventually
from tests.server_support import ALPHA, running_api
from wakeful import ManualClock
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.metrics import Metrics, serve_metrics
from wakeful.runtime import START, Graph
from wakeful.store.memory import MemoryStore

WORKER_FAMILIES = {
    "wakeful_leases",
    "wakeful_retries",
    "wakeful_settles",
    "wakeful_exhausted",
    "wakeful_stalled_runs",
    "wakeful_stream_checkpoint_failures",
    "wakeful_worker_running_dispatches",
    "wakeful_queue_wait_seconds",
    "wakeful_run_duration_seconds",
    "wakeful_store_write_duration_seconds",
    "wakeful_model_time_to_first_token_seconds",
    "wakeful_model_output_tokens_per_second",
    "wakeful_model_retries",
    "wakeful_stream_recoveries",
    "wakeful_tool_duration_seconds",
}
"""What worker processes count (leases, settles, runs, store writes, models, tools)."""


@pytest.mark.asyncio
async def test_a_worker_counts_leases_and_settles_and_serves_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="wakeful.metrics")
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
    text = response.split("\r\n\r\n", 1)[1]
    assert sample(text, 'wakeful_settles_total{outcome="done"}') == 1
    assert sample(text, "wakeful_leases_total") == 1
    served = [r.getMessage() for r in caplog.records if r.name == "wakeful.metrics"]
    assert served == [f"serving metrics at http://127.0.0.1:{port}/metrics"]


@pytest.mark.asyncio
async def test_a_servers_scrape_has_no_worker_metrics_and_a_workers_has_them_all() -> None:
    store = MemoryStore()
    async with running_api(store) as api:
        assert await api.client(ALPHA).post("/v1/threads/t1/runs", json={"target": "echo"})
        scrape = (await api.client(None).get("/metrics")).text
    server = set(families(scrape))
    assert not server & WORKER_FAMILIES, server & WORKER_FAMILIES
    assert not [name for name in server if name.startswith("wakeful_worker_")]
    assert {"wakeful_http_requests", "wakeful_submits", "wakeful_stale_claims"} <= server
    assert sample(scrape, 'wakeful_submits_total{kind="start"}') == 1
    graph = Graph({"x": None}, name="g").node("n", lambda s: {"x": 1}).edge(START, "n").compile()
    worker = Worker(store, Registry().add("g", graph), metrics=Metrics())
    text = worker.metrics.render()
    assert set(families(text)) >= WORKER_FAMILIES, WORKER_FAMILIES - set(families(text))
    assert sample(text, "wakeful_leases_total") == 0
    assert sample(text, "wakeful_worker_running_dispatches") == 0


def test_render_is_prometheus_text() -> None:
    metrics = Metrics()
    metrics.retries.inc()
    metrics.http_seconds.observe(0.003, route="/x", method="GET")
    text = metrics.render()
    assert families(text)["wakeful_retries"] == "counter"
    assert sample(text, "wakeful_retries_total") == 1
    bucket = 'wakeful_http_request_duration_seconds_bucket{route="/x",method="GET",le="0.005"}'
    assert sample(text, bucket) == 1
    assert (
        metrics.retries.value() == 1 and metrics.http_seconds.count(route="/x", method="GET") == 1
    )


def test_two_metrics_objects_do_not_share_values() -> None:
    first, second = Metrics(), Metrics()
    first.leases.inc(2)
    assert second.leases.value() == 0 and first.leases.value() == 2
    with pytest.raises(ValueError, match="takes labels"):
        first.settles.inc(kind="x")


def test_labels_passed_in_any_order_or_type_reach_the_same_values() -> None:
    metrics = Metrics()
    seconds = metrics.run_seconds
    seconds.observe(0.2, target="g", outcome="done")
    seconds.observe(0.3, outcome="done", target="g")  # remembered as passed: another order
    seconds.observe(0.4, target="g", outcome="done")
    assert seconds.count(target="g", outcome="done") == 3
    metrics.settles.inc(outcome=1)  # type: ignore[arg-type]  # str() of the value, as before
    metrics.settles.inc(outcome="1")
    metrics.settles.inc(outcome=[1])  # type: ignore[arg-type]  # cannot be remembered
    assert metrics.settles.value(outcome="1") == 2 and metrics.settles.value(outcome="[1]") == 1
    metrics.settles.inc(outcome=True)  # type: ignore[arg-type]  # equal to 1, but "True"
    assert metrics.settles.value(outcome="True") == 1 and metrics.settles.value(outcome="1") == 2
    for _ in range(2):  # a wrong label set is refused every time, never remembered
        with pytest.raises(ValueError, match="takes labels"):
            seconds.observe(0.1, target="g")
        with pytest.raises(ValueError, match="takes labels"):
            seconds.observe(0.1, target="g", outcome="done", extra="x")


COUNT_IN_CHILD = """
import sys
from wakeful.metrics import Metrics
metrics = Metrics()
metrics.leases.inc(int(sys.argv[1]))
metrics.run_seconds.observe(0.2, target="g", outcome="done")
"""


def test_multiprocess_mode_aggregates_every_worker_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for leases in (1, 2):
        done = subprocess.run(
            [sys.executable, "-c", COUNT_IN_CHILD, str(leases)],
            env=env,
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr.decode()
    assert list(tmp_path.glob("*.db")), "each process wrote its values to the directory"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    text = Metrics().render()
    assert sample(text, "wakeful_leases_total") == 3
    done_runs = 'wakeful_run_duration_seconds_count{target="g",outcome="done"}'
    assert sample(text, done_runs) == 2
    assert families(text)["wakeful_run_duration_seconds"] == "histogram"
