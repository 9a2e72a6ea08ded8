"""Child process for the cross-process tracing tests. It records its spans with the SDK
into a JSON-lines file (one span per line, written as each span ends), so the parent can
read them after the child exits or is killed.

- ``worker URL SPANS DISPATCH``: run a worker until ``DISPATCH`` is done, then stop.
- ``crash URL SPANS COUNTER READY``: start the crash graph of ``tests.runtime_child`` and
  hang in its second task (the parent kills the process)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.runtime_child import build
from tests.runtime_support import mark_ready
from wakeful import open_store, telemetry
from wakeful.fleet import Registry, Worker
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime

GRAPH = Graph({"x": None}, name="g").node("n", lambda s: {"x": 1}).edge(START, "n").compile()


class FileExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a", encoding="utf-8") as out:
            for span in spans:
                assert span.context is not None
                out.write(json.dumps(span_json(span)) + "\n")
        return SpanExportResult.SUCCESS


def span_json(span: ReadableSpan) -> dict[str, object]:
    assert span.context is not None
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes or {}),
    }


def record_spans(path: Path) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    telemetry.configure(provider)
    return provider


async def worker(url: str, spans: Path, dispatch_id: str) -> None:
    provider = record_spans(spans)
    store = await open_store(url)
    w = Worker(store, Registry().add("g", GRAPH), poll_interval=0.05, relay=False)
    running = asyncio.create_task(w.run())
    for _ in range(6000):
        found = await store.get_dispatch(dispatch_id)
        if found is not None and found.status == "done":
            break
        await asyncio.sleep(0.01)
    await w.stop(5)
    await running
    await store.close()
    provider.shutdown()


async def crash(url: str, spans: Path, counter: Path, ready: Path) -> None:
    record_spans(spans)
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    await runtime.start("t", build(counter, hang_b=True), {})
    while True:
        snap = await store.read("t")
        if snap is not None and [w.node for w in snap.writes] == ["a"]:
            await asyncio.to_thread(mark_ready, ready, "ready")
            break
        await asyncio.sleep(0.01)
    await asyncio.Event().wait()


if __name__ == "__main__":
    mode, url, path, *rest = sys.argv[1:]
    if mode == "worker":
        asyncio.run(worker(url, Path(path), rest[0]))
    else:
        asyncio.run(crash(url, Path(path), Path(rest[0]), Path(rest[1])))
