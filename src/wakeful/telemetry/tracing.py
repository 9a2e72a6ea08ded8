"""Spans through the OpenTelemetry API, and nothing at all without an SDK.

wakeful instruments with ``opentelemetry-api`` only (the ``otel`` extra). Which tracer
provider records is the application's choice: the global one
(``opentelemetry.trace.set_tracer_provider``) or one given to ``configure``. While no SDK
provider is configured, or the API is not installed, ``tracer()`` is ``None`` and every
helper here returns a shared no-op object: no span, no context change, no allocation
beyond the call itself.

Carriers are plain ``dict[str, str]`` with the W3C ``traceparent`` (and ``tracestate``)
keys, so a trace context can be stored in a dispatch's payload or a checkpoint's metadata
and continued by another process. Only the W3C trace context is stored: baggage is never
persisted (it may carry anything).
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from wakeful.redact import redact

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider

try:
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _HAVE_API = True
except ImportError:  # the ``otel`` extra is not installed: tracing stays off
    _otel_trace = None  # type: ignore[assignment]
    _otel_context = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]
    _HAVE_API = False

INSTRUMENTATION = "wakeful"
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI conventions' opt-in for prompt and completion text on spans (``true``)."""
MAX_TRACESTATE = 512
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_GLOBAL_SLOT = _HAVE_API and hasattr(_otel_trace, "_TRACER_PROVIDER")
"""The API keeps its global provider in a module attribute we can read without a call."""
"""An SDK named in the environment is set up by the API on first use."""
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]
Attributes = Mapping[str, AttributeValue]


class SpanLike(Protocol):
    """What wakeful calls on a span: an OpenTelemetry ``Span`` or the no-op ``NO_SPAN``."""

    def set_attribute(self, key: str, value: Any) -> None: ...

    def add_event(
        self, name: str, attributes: Any = None, timestamp: int | None = None
    ) -> None: ...

    def is_recording(self) -> bool: ...


class _NoSpan:
    """The span (and span context manager) used while tracing is off."""

    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NO_SPAN = _NoSpan()


class _Settings:
    """Process-wide: the provider given to ``configure`` and the tracer cached for the
    provider in force."""

    provider: TracerProvider | None = None
    enabled: bool = True
    capture_content: bool | None = None
    cached_for: object = None
    cached: Tracer | None = None
    global_only: bool = _GLOBAL_SLOT and not _PROVIDER_FROM_ENV
    """No provider given to ``configure`` and none to be made from the environment: while
    the API's global provider is unset, ``tracer()`` answers ``None`` at once."""


def configure(
    tracer_provider: TracerProvider | None = None,
    *,
    enabled: bool = True,
    capture_content: bool | None = None,
) -> None:
    """Choose what records wakeful's spans: ``tracer_provider`` (default: the global
    provider, read at each span, so setting it later works too). ``enabled=False`` turns
    wakeful's spans off whatever provider is set. ``capture_content=True`` puts prompt and
    completion text on model-call spans (default: the ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_
    MESSAGE_CONTENT`` environment variable; off when unset). Tests use it to record into
    an in-memory exporter without touching the global provider."""
    _Settings.provider = tracer_provider
    _Settings.enabled = enabled
    _Settings.global_only = _GLOBAL_SLOT and tracer_provider is None and not _PROVIDER_FROM_ENV
    _Settings.capture_content = capture_content
    _Settings.cached_for, _Settings.cached = None, None


def _global_provider() -> object:
    """The global provider, or ``None`` while none is set. ``get_tracer_provider()`` reads
    the environment on every call (microseconds): the module's global is read first."""
    assert _otel_trace is not None
    provider = getattr(_otel_trace, "_TRACER_PROVIDER", _otel_trace)
    if provider is None and not _PROVIDER_FROM_ENV:
        return None
    if provider is None or provider is _otel_trace:  # set from the environment, or unknown
        return _otel_trace.get_tracer_provider()
    return provider


def tracer() -> Tracer | None:
    """The tracer wakeful records with, or ``None`` while tracing is off (no API, no SDK
    provider, or ``configure(enabled=False)``)."""
    if not (_HAVE_API and _Settings.enabled):
        return None
    if _Settings.global_only and _otel_trace._TRACER_PROVIDER is None:
        return None  # no SDK: as cheap as tracing turned off (this runs per span)
    provider = _Settings.provider or _global_provider()
    if provider is _Settings.cached_for:
        return _Settings.cached
    made: Tracer | None = None
    if isinstance(provider, _otel_trace.TracerProvider) and not isinstance(
        provider, _otel_trace.ProxyTracerProvider | _otel_trace.NoOpTracerProvider
    ):
        from wakeful import __version__

        made = provider.get_tracer(INSTRUMENTATION, __version__)
    _Settings.cached_for, _Settings.cached = provider, made
    return made


def capture_content() -> bool:
    """Whether prompt and completion text may go on spans (an explicit opt-in)."""
    if _Settings.capture_content is not None:
        return _Settings.capture_content
    return os.environ.get(CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")


_KINDS: dict[str, SpanKind] = {k.name.lower(): k for k in _otel_trace.SpanKind} if _HAVE_API else {}


def kind(name: str) -> SpanKind | None:
    """``SpanKind`` by name (``"client"``, ``"server"``, ``"consumer"``, ``"producer"``)."""
    if not _HAVE_API:
        return None
    return _KINDS[name.lower()]


class _Current:
    """Makes ``span`` current for a ``with`` block; ends it at exit unless ``end`` is
    false. An exception marks the span as failed (``error.type``), except cancellation,
    which is recorded as ``wakeful.cancelled`` (a cancelled run is not an error)."""

    __slots__ = ("_end", "_span", "_token")

    def __init__(self, span: Span, end: bool) -> None:
        self._span = span
        self._end = end
        self._token: object = None

    def __enter__(self) -> Span:
        assert _otel_context is not None and _otel_trace is not None
        self._token = _otel_context.attach(_otel_trace.set_span_in_context(self._span))
        return self._span

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert _otel_context is not None
        try:
            if exc is not None:
                failed(self._span, exc)
            if self._end:
                self._span.end()
        finally:
            _otel_context.detach(self._token)  # type: ignore[arg-type]


def failed(span: SpanLike, exc: BaseException) -> None:
    """Record ``exc`` on ``span``: ``error.type`` and an error status, or
    ``wakeful.cancelled`` for a cancellation."""
    if not span.is_recording():
        return
    if not isinstance(exc, Exception):
        span.set_attribute("wakeful.cancelled", True)
        return
    assert _otel_trace is not None
    real: Any = span
    real.set_attribute("error.type", type(exc).__name__)
    real.record_exception(exc)
    real.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, type(exc).__name__))


def start(
    name: str,
    attributes: Attributes | None = None,
    *,
    kind: SpanKind | None = None,
    parent: Context | None = None,
    links: Sequence[Link | None] = (),
    start_time: int | None = None,
) -> SpanLike:
    """Start a span without making it current (end it with ``finish``, make it current
    with ``use``). ``parent``: a context from ``extract`` (default: the current one);
    ``start_time`` in nanoseconds since the epoch."""
    t = tracer()
    if t is None:
        return NO_SPAN
    return t.start_span(
        name,
        context=parent,
        kind=kind or _KINDS["internal"],
        attributes=attributes,
        links=([link for link in links if link is not None] or None) if links else None,
        start_time=start_time,
        record_exception=False,
        set_status_on_exception=False,
    )


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    kind: SpanKind | None = None,
    parent: Context | None = None,
    links: Sequence[Link | None] = (),
) -> _Current | _NoSpan:
    """``with span("name", {...}) as s:`` a current span for the block, ended at its exit
    (failed if the block raises)."""
    started = start(name, attributes, kind=kind, parent=parent, links=links)
    if started is NO_SPAN:
        return NO_SPAN
    return _Current(started, end=True)  # type: ignore[arg-type]


def use(span: SpanLike, *, end: bool = False) -> _Current | _NoSpan:
    """Make a span from ``start`` current for a ``with`` block (ending it at the exit only
    with ``end=True``)."""
    if span is NO_SPAN or not _HAVE_API:
        return NO_SPAN
    return _Current(span, end=end)  # type: ignore[arg-type]


def finish(span: SpanLike, exc: BaseException | None = None, end_time: int | None = None) -> None:
    """End a span from ``start``, failed by ``exc`` if given."""
    if span is NO_SPAN:
        return
    if exc is not None:
        failed(span, exc)
    span.end(end_time=end_time)  # type: ignore[attr-defined]


def current() -> SpanLike:
    """The current span (``NO_SPAN`` while tracing is off or none is current)."""
    if tracer() is None:
        return NO_SPAN
    return _otel_trace.get_current_span()


def inject(span: SpanLike | None = None) -> dict[str, str]:
    """The W3C trace context of ``span`` (default: the current span) as a plain dict, or
    ``{}`` while tracing is off or there is no valid span."""
    if tracer() is None:
        return {}
    assert _otel_trace is not None
    target: Any = span if span is not None else _otel_trace.get_current_span()
    if target is NO_SPAN or not target.get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, _otel_trace.set_span_in_context(target))
    return carrier


def _checked(carrier: object) -> dict[str, str] | None:
    """A carrier as stored data may hold it: only well-formed W3C fields pass."""
    if not isinstance(carrier, Mapping):
        return None
    parent = carrier.get("traceparent")
    if not isinstance(parent, str) or not _TRACEPARENT.match(parent):
        return None
    clean = {"traceparent": parent}
    state = carrier.get("tracestate")
    if isinstance(state, str) and len(state) <= MAX_TRACESTATE:
        clean["tracestate"] = state
    return clean


def extract(carrier: object) -> Context | None:
    """The context a carrier from ``inject`` names (to pass as ``parent``), or ``None``
    for anything else (tracing off, missing or malformed fields)."""
    clean = _checked(carrier)
    if clean is None or tracer() is None:
        return None
    assert _otel_trace is not None
    context = TraceContextTextMapPropagator().extract(clean)
    if not _otel_trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def link(carrier: object, attributes: Attributes | None = None) -> Link | None:
    """A link to the span a carrier names (e.g. a crashed attempt's run), or ``None``."""
    context = extract(carrier)
    if context is None:
        return None
    assert _otel_trace is not None
    target = _otel_trace.get_current_span(context).get_span_context()
    return _otel_trace.Link(target, attributes)


def ids() -> tuple[str, str] | None:
    """The current trace id and span id as lowercase hex, or ``None`` without a valid
    recording context (for log lines)."""
    if not _HAVE_API:
        return None
    context = _otel_trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


URL_ATTRIBUTES = ("url.query", "url.full", "http.target", "http.url")
"""Span attributes that carry a request's query string: ``redact_spans`` cleans them."""
_REDACTING: weakref.WeakSet[Any] = weakref.WeakSet()


def redact_spans(tracer_provider: object | None = None) -> bool:
    """Redact the credentials in the ``URL_ATTRIBUTES`` of every span the provider records,
    wakeful's and other instrumentations' alike (an ASGI instrumentation records
    ``url.query`` as the client sent it, ``?access_token=...`` included), as each span
    starts: ``wakeful.redact.redact``, the rule of the access log. ``tracer_provider``:
    default the one wakeful records with (``configure``'s, else the global one). Adds one
    span processor per provider (calling again adds none); ``False`` when the provider is
    not an SDK provider (nothing records, nothing to redact)."""
    if not _HAVE_API:
        return False
    try:
        from opentelemetry.sdk.trace import SpanProcessor
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    except ImportError:
        return False
    provider = tracer_provider or _Settings.provider or _otel_trace.get_tracer_provider()
    if not isinstance(provider, SdkTracerProvider):
        return False
    if provider in _REDACTING:
        return True

    class _RedactingProcessor(SpanProcessor):
        def on_start(self, span: Any, parent_context: Context | None = None) -> None:
            attributes = span.attributes or {}
            for key in URL_ATTRIBUTES:
                value = attributes.get(key)
                if isinstance(value, str) and (clean := redact(value)) != value:
                    span.set_attribute(key, clean)

    provider.add_span_processor(_RedactingProcessor())
    _REDACTING.add(provider)
    return True
