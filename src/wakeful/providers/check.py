"""Is an OpenAI-compatible endpoint usable by wakeful? One tiny streamed request and one with
a tool, through ``OpenAIChat`` itself, and a report of what the endpoint supports and what the
adapter had to work around. ``wakeful providers check`` prints it."""

from __future__ import annotations

import time
from typing import Literal

import httpx
import msgspec

from wakeful.errors import InvalidInput
from wakeful.providers.base import (
    ModelRequest,
    ProviderError,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
)
from wakeful.providers.http import (
    Observation,
    error_from_response,
    error_from_transport,
    request_id_of,
)
from wakeful.providers.openai import OpenAIChat
from wakeful.records import Message

Verdict = Literal["usable", "text_only", "unusable", "unreachable"]

TEXT_PROMPT = "Reply with one short word."
TOOL_PROMPT = "What time is it in UTC? Call the get_time tool to find out; do not guess."
TIME_TOOL = ToolSpec(
    name="get_time",
    description="The current time in a time zone.",
    parameters={
        "type": "object",
        "properties": {"tz": {"type": "string", "description": "An IANA time zone, e.g. UTC"}},
        "required": ["tz"],
    },
)
RETRY_HEADERS = ("retry-after", "retry-after-ms")


class Check(msgspec.Struct, frozen=True):
    """One line of the report: ``ok`` is ``None`` for information."""

    name: str
    ok: bool | None
    detail: str


class EndpointReport(msgspec.Struct, frozen=True, kw_only=True):
    """``verdict``: ``usable`` (streams text and tool calls), ``text_only`` (tool calls did
    not work), ``unusable`` (it answered, but the streamed request failed) or
    ``unreachable`` (no answer at all)."""

    base_url: str
    model: str
    verdict: Verdict
    checks: list[Check]
    workarounds: list[str]


class _Probe:
    def __init__(self) -> None:
        self.observation = Observation()
        self.items: list[StreamItem] = []
        self.error: ProviderError | None = None
        self.seconds = 0.0

    @property
    def end(self) -> StreamEnd | None:
        last = self.items[-1] if self.items else None
        return last if isinstance(last, StreamEnd) else None

    @property
    def text(self) -> str:
        return "".join(i.text for i in self.items if isinstance(i, TextDelta))

    def calls(self) -> list[dict[str, str]]:
        calls: dict[int, dict[str, str]] = {}
        for item in self.items:
            if isinstance(item, ToolCallDelta):
                call = calls.setdefault(item.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = item.id or call["id"]
                call["name"] = item.name or call["name"]
                call["arguments"] += item.arguments
        return [calls[i] for i in sorted(calls)]


def check_url(base_url: str) -> str:
    """``base_url`` without a trailing slash, if it is an absolute http(s) URL; else
    ``InvalidInput``."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise InvalidInput("base URL", f"{base_url!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InvalidInput(
            "base URL",
            f"{base_url!r} is not an http(s) URL with a host "
            "(for example http://localhost:11434/v1)",
        )
    return base_url.rstrip("/")


async def check_endpoint(
    base_url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    timeout: float = 30.0,
) -> EndpointReport:
    """Probe ``{base_url}/chat/completions``. Without ``model``, the first model that
    ``{base_url}/models`` lists is used (``InvalidInput`` if it lists none). ``api_key`` is
    sent as a bearer token; without it no key is sent (not even ``$OPENAI_API_KEY``).
    ``timeout`` bounds each connect and each silence of a probe."""
    base_url = check_url(base_url)
    if timeout <= 0:
        raise InvalidInput("timeout", "must be a positive number of seconds")
    limits = httpx.Timeout(timeout, connect=min(timeout, 10.0))
    key = api_key or ""
    if not model:
        try:
            model = await _first_model(base_url, key, limits)
        except ProviderError as exc:
            return _unanswered(base_url, "", exc)
    async with OpenAIChat(model, base_url=base_url, api_key=key, timeout=limits) as provider:
        text = await _probe(provider, ModelRequest(model=model, messages=_ask(TEXT_PROMPT)))
        if text.error is not None:
            return _failed(base_url, model, text)
        tool_request = ModelRequest(
            model=model, messages=_ask(TOOL_PROMPT), tools=(TIME_TOOL,), max_tokens=256
        )
        tools = await _probe(provider, tool_request)
    return _report(base_url, model, text, tools)


def _ask(prompt: str) -> tuple[Message, ...]:
    return (Message(id="check-1", role="user", content=prompt),)


async def _first_model(base_url: str, key: str, timeout: httpx.Timeout) -> str:
    """The first model ``{base_url}/models`` lists. A transport failure raises
    ``ProviderError`` (the endpoint is unreachable); an answer without a model raises
    ``InvalidInput``."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            response = await client.get(f"{base_url}/models", headers=headers)
    except httpx.RequestError as exc:
        raise error_from_transport(exc) from exc
    if not response.is_success:
        error = error_from_response(response)
        raise InvalidInput("model", f"none given, and {base_url}/models failed ({error}): pass one")
    try:
        listed = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        listed = None
    data = listed.get("data") if isinstance(listed, dict) else None
    for entry in data if isinstance(data, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]:
            return str(entry["id"])
    raise InvalidInput("model", f"none given, and {base_url}/models lists none: pass one")


async def _probe(provider: OpenAIChat, request: ModelRequest) -> _Probe:
    probe = _Probe()
    started = time.monotonic()
    try:
        async for item in provider.stream(request, observation=probe.observation):
            probe.items.append(item)
    except ProviderError as exc:
        probe.error = exc
    probe.seconds = time.monotonic() - started
    return probe


def _unanswered(base_url: str, model: str, error: ProviderError) -> EndpointReport:
    checks = [Check("reachable", False, _error_text(error))]
    return EndpointReport(
        base_url=base_url, model=model, verdict="unreachable", checks=checks, workarounds=[]
    )


def _failed(base_url: str, model: str, probe: _Probe) -> EndpointReport:
    error = probe.error
    assert error is not None
    observation = probe.observation
    if observation.status is None:
        return _unanswered(base_url, model, error)
    checks = [
        Check("reachable", True, f"HTTP {observation.status} after {probe.seconds:.2f} s"),
        Check("streamed text", False, _error_text(error)),
        *_headers_checks([observation], error),
    ]
    return EndpointReport(
        base_url=base_url,
        model=model,
        verdict="unusable",
        checks=checks,
        workarounds=list(observation.workarounds),
    )


def _report(base_url: str, model: str, text: _Probe, tools: _Probe) -> EndpointReport:
    observation = text.observation
    end = text.end
    assert end is not None
    first_byte = observation.first_byte_after
    timing = f", first byte after {first_byte:.2f} s" if first_byte is not None else ""
    usage = end.usage
    calls = [c for c in tools.calls() if c["name"] == TIME_TOOL.name and _is_object(c)]
    checks = [
        Check("reachable", True, f"HTTP {observation.status}"),
        Check("streaming", True, f"{observation.events} events{timing}"),
        Check("streamed text", True, f"{text.text.strip()[:60]!r} (stop: {end.stop_reason})"),
        Check(
            "usage",
            usage is not None,
            f"{usage.input_tokens} in, {usage.output_tokens} out"
            if usage is not None
            else "not reported (stream_options.include_usage ignored): runs record no tokens",
        ),
        Check("tool calls", bool(calls), _tool_text(tools, calls)),
        *_headers_checks([observation, tools.observation], tools.error),
    ]
    workarounds = list(observation.workarounds)
    workarounds += [w for w in tools.observation.workarounds if w not in workarounds]
    return EndpointReport(
        base_url=base_url,
        model=model,
        verdict="usable" if calls else "text_only",
        checks=checks,
        workarounds=workarounds,
    )


def _is_object(call: dict[str, str]) -> bool:
    try:
        return isinstance(msgspec.json.decode(call["arguments"] or "{}"), dict)
    except msgspec.DecodeError:
        return False


def _tool_text(probe: _Probe, calls: list[dict[str, str]]) -> str:
    if calls:
        return f"{calls[0]['name']}({calls[0]['arguments']})"
    if probe.error is not None:
        return f"failed: {_error_text(probe.error)}"
    if probe.calls():
        return f"malformed call: {probe.calls()[0]}"
    return "no call: the model answered with text instead of calling the tool"


def _headers_checks(observations: list[Observation], error: ProviderError | None) -> list[Check]:
    headers: dict[str, str] = {}
    for observation in observations:
        headers.update(observation.headers)
    hints = [
        f"{name}: {value}"
        for name, value in sorted(headers.items())
        if name in RETRY_HEADERS or name.startswith("x-ratelimit-")
    ]
    if error is not None and error.retry_after is not None:
        hints.insert(0, f"retry after {error.retry_after:g} s")
    request_id = request_id_of(headers)
    return [
        Check(
            "retry hints",
            None,
            ", ".join(hints[:6]) if hints else "none seen (wakeful backs off on its own)",
        ),
        Check(
            "request id",
            None,
            request_id if request_id else "none (errors will not name the request)",
        ),
    ]


def _error_text(error: ProviderError) -> str:
    retry = "retryable" if error.retryable else "permanent"
    status = f"HTTP {error.status}, " if error.status is not None else ""
    return f"{error.kind} ({status}{retry}): {error.detail}"
