"""The telemetry helpers: no-op without an SDK, spans, W3C carriers, links, log ids."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.telemetry_support import attr, one, spans
from wakeful import telemetry
from wakeful.errors import StaleClaim
from wakeful.store.memory import MemoryStore

__all__ = ["spans"]


def test_without_an_sdk_nothing_is_recorded_or_propagated() -> None:
    assert telemetry.tracer() is None
    with telemetry.span("x", {"a": 1}) as span:
        assert span is telemetry.NO_SPAN and not span.is_recording()
        assert telemetry.inject() == {}
    assert telemetry.extract({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
    assert telemetry.ids() is None


def test_disabled_tracing_ignores_a_configured_provider(spans: InMemorySpanExporter) -> None:
    assert telemetry.tracer() is not None
    telemetry.configure(enabled=False)
    with telemetry.span("hidden"):
        pass
    assert spans.get_finished_spans() == ()


def test_a_span_carries_attributes_events_and_a_failure(spans: InMemorySpanExporter) -> None:
    def fail() -> None:
        with telemetry.span("work", {"k": "v"}) as span:
            span.add_event("halfway", {"n": 2})
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fail()
    work = one(spans.get_finished_spans(), "work")
    assert attr(work, "k") == "v" and attr(work, "error.type") == "ValueError"
    assert [e.name for e in work.events][:1] == ["halfway"]
    assert not work.status.is_ok


def test_a_carrier_continues_the_trace_and_links_to_it(spans: InMemorySpanExporter) -> None:
    with telemetry.span("sender") as sender:
        carrier = telemetry.inject()
        ids = telemetry.ids()
    assert set(carrier) == {"traceparent"} and ids is not None
    parent = telemetry.extract(dict(carrier))
    with telemetry.span("receiver", parent=parent):
        pass
    with telemetry.span("later", links=[telemetry.link(carrier, {"why": "test"})]):
        pass
    finished = spans.get_finished_spans()
    sent, received, later = (one(finished, n) for n in ("sender", "receiver", "later"))
    assert sent.context is not None and received.parent is not None
    assert received.context is not None and received.context.trace_id == sent.context.trace_id
    assert received.parent.span_id == sent.context.span_id == int(ids[1], 16)
    assert later.context is not None and later.context.trace_id != sent.context.trace_id
    assert [link.context.span_id for link in later.links] == [sent.context.span_id]
    del sender


@pytest.mark.parametrize(
    "carrier",
    [None, "x", {}, {"traceparent": 7}, {"traceparent": "00-zz-1-01"}, {"traceparent": "0" * 55}],
)
def test_malformed_carriers_are_ignored(spans: InMemorySpanExporter, carrier: object) -> None:
    assert telemetry.extract(carrier) is None and telemetry.link(carrier) is None


@pytest.mark.asyncio
async def test_a_store_call_records_the_backend_and_the_refusal(
    spans: InMemorySpanExporter,
) -> None:
    observed: list[tuple[float, dict[str, str]]] = []

    class Seconds:
        def observe(self, value: float, **labels: str) -> None:
            observed.append((value, labels))

    calls = telemetry.StoreCalls(MemoryStore(), Seconds())

    async def refused() -> None:
        raise StaleClaim("t", 1, 2)

    async def fine() -> int:
        return 3

    assert await calls("commit", fine, thread_id="t") == 3
    with pytest.raises(StaleClaim):
        await calls("settle", refused)
    finished = spans.get_finished_spans()
    commit, settle = one(finished, "commit memory"), one(finished, "settle memory")
    assert attr(commit, "db.system") == "memory" and attr(commit, "wakeful.outcome") == "ok"
    assert attr(commit, "wakeful.thread.id") == "t"
    assert attr(settle, "wakeful.outcome") == "StaleClaim"
    assert [labels for _, labels in observed] == [
        {"store": "memory", "operation": "commit"},
        {"store": "memory", "operation": "settle"},
    ]


def test_log_records_name_the_current_trace(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.handler.addFilter(telemetry.TraceContextFilter())
    log = logging.getLogger("wakeful.test")
    with caplog.at_level(logging.INFO, "wakeful.test"):
        log.info("outside")
        with telemetry.span("inside"):
            log.info("inside")
    outside, inside = caplog.records
    span = one(spans.get_finished_spans(), "inside")
    assert span.context is not None
    assert (outside.trace_id, outside.span_id) == ("", "")  # type: ignore[attr-defined]
    assert inside.trace_id == f"{span.context.trace_id:032x}"  # type: ignore[attr-defined]
    assert inside.span_id == f"{span.context.span_id:016x}"  # type: ignore[attr-defined]
    line = logging.Formatter(telemetry.TRACE_FORMAT).format(inside)
    assert f"trace_id={span.context.trace_id:032x}" in line


def test_a_global_provider_set_after_the_first_span_is_used_from_then_on() -> None:
    """The no-SDK fast path answers ``None`` only while the API's global provider is unset:
    an application that sets it later (after wakeful made spans) is traced from then on. In a
    subprocess: the global provider can be set once per process."""
    import subprocess
    import sys

    script = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from wakeful import telemetry

with telemetry.span("before"):
    pass
assert telemetry.tracer() is None
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with telemetry.span("after"):
    pass
print(",".join(s.name for s in exporter.get_finished_spans()))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "after"
