"""Recording wakeful's spans in tests: an SDK tracer provider with an in-memory exporter,
given to ``wakeful.telemetry.configure`` (the global provider is never touched, so other
tests in the same process run with tracing off)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wakeful import telemetry


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(provider)
    try:
        yield exporter
    finally:
        telemetry.configure()
        provider.shutdown()


def named(finished: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def one(finished: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = named(finished, name)
    assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in finished]}"
    return found[0]


def children(finished: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [
        s for s in finished if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def attr(span: ReadableSpan, key: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(key)
