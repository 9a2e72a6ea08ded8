"""Traces across processes: a dispatch submitted here and run by a worker subprocess is
one trace; a run recovered after its process was SIGKILLed links to the crashed attempt."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.runtime_child import build
from tests.runtime_support import kill_when_ready, store_url
from tests.telemetry_support import attr, one, spans
from wakeful import ManualClock, open_store, telemetry
from wakeful.fleet import submit
from wakeful.runtime import ClaimPolicy, Runtime

__all__ = ["spans"]
ROOT = Path(__file__).resolve().parent.parent


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def by_name(found: list[dict[str, Any]], name: str) -> dict[str, Any]:
    matching = [s for s in found if s["name"] == name]
    assert len(matching) == 1, [s["name"] for s in found]
    return matching[0]


@pytest.mark.asyncio
async def test_a_dispatch_submitted_here_and_run_by_a_worker_process_is_one_trace(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    url = store_url("sqlite", tmp_path)
    store = await open_store(url)
    try:
        with telemetry.span("client request"):
            await submit(store, "t", "g", {}, dispatch_id="d1")
        stored = await store.get_dispatch("d1")
    finally:
        await store.close()
    assert stored is not None and set(stored.payload["trace"]) == {"traceparent"}
    child_spans = tmp_path / "child-spans.jsonl"
    child = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tests.telemetry_child", "worker", url, str(child_spans), "d1"],
        cwd=ROOT,
        capture_output=True,
        timeout=90,
    )
    assert child.returncode == 0, child.stderr.decode()

    here = spans.get_finished_spans()
    request, submitted = one(here, "client request"), one(here, "wakeful.submit start")
    assert request.context is not None and submitted.context is not None
    assert submitted.parent is not None and submitted.parent.span_id == request.context.span_id
    assert attr(submitted, "wakeful.dispatch.id") == "d1"
    trace_id = f"{request.context.trace_id:032x}"
    there = read_spans(child_spans)
    dispatch, waited = (
        by_name(there, "wakeful.dispatch start"),
        by_name(there, "wakeful.queue.wait"),
    )
    run = by_name(there, "wakeful.run g")
    assert {s["trace_id"] for s in (dispatch, waited, run)} == {trace_id}
    submit_id = f"{submitted.context.span_id:016x}"
    assert dispatch["parent_id"] == submit_id and waited["parent_id"] == submit_id
    assert run["parent_id"] == dispatch["span_id"]
    assert dispatch["attributes"]["wakeful.dispatch.outcome"] == "done"
    claimed = by_name(there, "claim_next sqlite")
    assert claimed["parent_id"] == dispatch["span_id"]
    assert claimed["attributes"]["db.system"] == "sqlite"
    tasks = [s for s in there if s["name"] == "wakeful.task n"]
    assert len(tasks) == 1 and tasks[0]["trace_id"] == trace_id


@pytest.mark.asyncio
async def test_a_run_recovered_after_sigkill_links_to_the_crashed_attempt(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    url = store_url("sqlite", tmp_path)
    counter, ready, child_spans = tmp_path / "calls", tmp_path / "ready", tmp_path / "spans"
    argv = ["tests.telemetry_child", "crash", url, str(child_spans), str(counter), str(ready)]
    await asyncio.to_thread(kill_when_ready, argv, [ready])

    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
    store = await open_store(url, clock=clock)
    try:
        snap = await store.read("t")
        assert snap is not None and snap.checkpoint is not None
        _, crashed_trace, crashed_span, _ = snap.checkpoint.metadata["trace"]["traceparent"].split(
            "-"
        )
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="parent")
        outcome = await (await runtime.recover("t", build(counter, hang_b=False))).result()
        assert outcome.status == "completed"
    finally:
        await store.close()
    there = read_spans(child_spans)
    admitted = by_name(there, "claim_and_commit sqlite")
    assert (admitted["trace_id"], admitted["parent_id"]) == (crashed_trace, crashed_span), (
        "the stored context is the crashed attempt's run span"
    )
    assert by_name(there, "wakeful.task a")["trace_id"] == crashed_trace

    recovered = one(spans.get_finished_spans(), "wakeful.run crash")
    assert recovered.context is not None
    assert f"{recovered.context.span_id:016x}" != crashed_span
    assert attr(recovered, "wakeful.run.operation") == "recover"
    (link,) = recovered.links
    assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == (
        crashed_trace,
        crashed_span,
    )
    assert dict(link.attributes or {}) == {"wakeful.link": "recovered_from"}
