"""The HTTP provider adapters against a real local server speaking both wire formats, plus the
SSE parser, Retry-After parsing and the classification table."""

from __future__ import annotations

import email.utils
import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.provider_server import (
    ProviderServer,
    Reply,
    anthropic_block_start,
    anthropic_block_stop,
    anthropic_delta,
    anthropic_end,
    anthropic_error,
    anthropic_error_event,
    anthropic_json,
    anthropic_start,
    anthropic_text,
    anthropic_tool_start,
    openai_chunk,
    openai_error,
    openai_text,
    openai_tool,
    openai_usage,
    sse,
)
from wakeful.providers import (
    AnthropicMessages,
    ModelRequest,
    OpenAIChat,
    Provider,
    ProviderError,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from wakeful.providers.base import RETRYABLE_KINDS
from wakeful.providers.http import SSEDecoder, SSEEvent, classify, parse_retry_after
from wakeful.providers.http import retry_after_from_headers as header_hint
from wakeful.records import Message

Adapter = OpenAIChat | AnthropicMessages
HELLO = ModelRequest(model="", messages=(Message(id="m1", role="user", content="Hi"),))
DONE = b"data: [DONE]\n\n"
ARGS = ['{"ci', 'ty": "Par', 'is"}']


@dataclass(frozen=True)
class Dialect:
    name: str
    make: Callable[..., Adapter]
    text: Callable[..., list[bytes]]
    lead: int  # events before the first text delta in ``text``
    error: Callable[[str | None, str | None], bytes]
    tools: list[bytes]  # two tool calls, streamed in fragments
    end: Usage


OPENAI = Dialect(
    "openai",
    lambda url, **kw: OpenAIChat("gpt-4o", base_url=f"{url}/v1", api_key="sk-test", **kw),
    openai_text,
    1,
    lambda type, code: openai_error(type, code),
    [
        openai_chunk({"role": "assistant", "content": None}),
        openai_tool(0, "call_1", "get_weather"),
        *(openai_tool(0, args=a) for a in ARGS),
        openai_tool(1, "call_2", "get_time"),
        openai_tool(1, args='{"tz": '),
        openai_tool(1, args='"CET"}'),
        openai_chunk({}, "tool_calls"),
        openai_usage(80, 40),
        DONE,
    ],
    Usage(19, 10),
)
ANTHROPIC = Dialect(
    "anthropic",
    lambda url, **kw: AnthropicMessages("claude-sonnet-4-5", base_url=url, api_key="sk-ant", **kw),
    anthropic_text,
    3,
    lambda type, code: anthropic_error(type or "api_error"),
    [
        anthropic_start(80),
        anthropic_tool_start(0, "call_1", "get_weather"),
        anthropic_json(0, ""),
        *(anthropic_json(0, a) for a in ARGS),
        anthropic_block_stop(0),
        anthropic_tool_start(1, "call_2", "get_time"),
        anthropic_json(1, '{"tz": '),
        anthropic_json(1, '"CET"}'),
        anthropic_block_stop(1),
        *anthropic_end("tool_use", 40),
    ],
    Usage(25, 15),
)


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as srv:
        yield srv


@pytest.fixture(params=[OPENAI, ANTHROPIC], ids=lambda d: d.name)
def dialect(request: pytest.FixtureRequest) -> Dialect:
    value: Dialect = request.param
    return value


def _ignore(n: int) -> None:
    pass


async def collect(
    provider: Provider, request: ModelRequest = HELLO, *, on_item: Callable[[int], None] = _ignore
) -> tuple[list[StreamItem], ProviderError | None]:
    items: list[StreamItem] = []
    try:
        async for item in provider.stream(request):
            items.append(item)
            on_item(len(items))
    except ProviderError as exc:
        return items, exc
    return items, None


def calls(items: list[StreamItem]) -> dict[int, tuple[str | None, str | None, str]]:
    out: dict[int, tuple[str | None, str | None, str]] = {}
    for item in items:
        if isinstance(item, ToolCallDelta):
            id, name, args = out.get(item.index, (None, None, ""))
            out[item.index] = (id or item.id, name or item.name, args + item.arguments)
    return out


# ------------------------------------------------------------------------ normal turns


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("framing", "chunk_size"), [("chunked", None), ("chunked", 3), ("close", None), ("close", 1)]
)
async def test_text_turn(
    server: ProviderServer, dialect: Dialect, framing: Any, chunk_size: int | None
) -> None:
    events = dialect.text("Bon", "jour ça ", "va 👋")
    server.push(Reply(events=events, framing=framing, chunk_size=chunk_size))
    async with dialect.make(server.url) as provider:
        assert isinstance(provider, Provider)
        items, error = await collect(provider)
    assert error is None
    assert items == [
        TextDelta("Bon"),
        TextDelta("jour ça "),
        TextDelta("va 👋"),
        StreamEnd("end_turn", dialect.end),
    ]


@pytest.mark.asyncio
async def test_two_tool_calls_in_fragments(server: ProviderServer, dialect: Dialect) -> None:
    server.push(Reply(events=dialect.tools, chunk_size=11))
    async with dialect.make(server.url) as provider:
        items, error = await collect(provider)
    assert error is None
    assert items[:2] == [
        ToolCallDelta(0, id="call_1", name="get_weather"),
        ToolCallDelta(0, arguments='{"ci'),
    ]
    assert calls(items) == {
        0: ("call_1", "get_weather", '{"city": "Paris"}'),
        1: ("call_2", "get_time", '{"tz": "CET"}'),
    }
    assert items[-1] == StreamEnd("tool_use", Usage(80, 40))
    assert sum(1 for i in items if isinstance(i, ToolCallDelta) and i.id) == 2


# ---------------------------------------------------------------------- HTTP errors

ERRORS = [  # status, headers, body error type, OpenAI code, kind, retry_after
    (429, [("Retry-After", "7")], "rate_limit_error", "rate_limit_exceeded", "rate_limited", 7.0),
    (429, [("Retry-After", "600")], "rate_limit_error", None, "rate_limited", 60.0),
    (429, [("retry-after-ms", "1500"), ("Retry-After", "2")], None, None, "rate_limited", 1.5),
    (529, [], "overloaded_error", None, "overloaded", None),
    (503, [("Retry-After", "3")], "api_error", None, "server", 3.0),
    (503, [], "overloaded_error", None, "overloaded", None),
    (500, [], "api_error", None, "server", None),
    (502, [], None, None, "server", None),
    (504, [], "timeout_error", None, "server", None),
    (408, [], None, None, "timeout", None),
    (400, [], "invalid_request_error", None, "invalid_request", None),
    (401, [], "authentication_error", "invalid_api_key", "auth", None),
    (403, [], "permission_error", None, "auth", None),
    (404, [], "not_found_error", "model_not_found", "not_found", None),
    (413, [], "request_too_large", None, "invalid_request", None),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "headers", "type", "code", "kind", "retry_after"),
    ERRORS,
    ids=[f"{e[0]}-{e[2]}" for e in ERRORS],
)
async def test_http_errors(
    server: ProviderServer,
    dialect: Dialect,
    status: int,
    headers: list[tuple[str, str]],
    type: str | None,
    code: str | None,
    kind: str,
    retry_after: float | None,
) -> None:
    body = dialect.error(type, code) if type else b"<html><body>502 Bad Gateway</body></html>"
    server.push(Reply(status=status, headers=headers, body=body))
    async with dialect.make(server.url) as provider:
        items, error = await collect(provider)
    assert items == []
    assert error is not None
    assert (error.kind, error.status, error.retry_after) == (kind, status, retry_after)
    assert error.retryable == (kind in RETRYABLE_KINDS)


@pytest.mark.asyncio
async def test_openai_context_length_exceeded(server: ProviderServer) -> None:
    server.push(
        Reply(status=400, body=openai_error("invalid_request_error", "context_length_exceeded"))
    )
    async with OPENAI.make(server.url) as provider:
        _, error = await collect(provider)
    assert error is not None
    assert (error.kind, error.retryable, error.status) == ("context_overflow", False, 400)


@pytest.mark.asyncio
async def test_anthropic_prompt_too_long_is_not_read_from_text(server: ProviderServer) -> None:
    body = anthropic_error("invalid_request_error", "prompt is too long: 210000 tokens > 200000")
    server.push(Reply(status=400, body=body, headers=[("request-id", "req_42")]))
    async with ANTHROPIC.make(server.url) as provider:
        _, error = await collect(provider)
    assert error is not None
    assert (error.kind, error.retryable) == ("invalid_request", False)
    assert "req_42" in error.detail


@pytest.mark.asyncio
async def test_json_instead_of_a_stream(server: ProviderServer, dialect: Dialect) -> None:
    server.push(Reply(body=b'{"id": "chatcmpl-1", "choices": []}'))
    server.push(Reply(body=dialect.error("overloaded_error", None)))
    async with dialect.make(server.url) as provider:
        _, first = await collect(provider)
        _, second = await collect(provider)
    assert first is not None and (first.kind, first.status) == ("invalid_request", 200)
    assert second is not None and second.kind == "overloaded"


# -------------------------------------------------------------- interrupted streams


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("drop", "framing"), [("fin", "chunked"), ("rst", "chunked"), ("fin", "close")]
)
async def test_dropped_after_partial_text(
    server: ProviderServer, dialect: Dialect, drop: Any, framing: Any
) -> None:
    events = dialect.text("Hel", "lo", " world")
    server.push(Reply(events=events, drop_after=dialect.lead + 2, drop=drop, framing=framing))

    def release_after_two(n: int) -> None:
        if n == 2:
            server.release.set()  # the rst gate: reset only once both deltas were read

    async with dialect.make(server.url) as provider:
        items, error = await collect(provider, on_item=release_after_two)
    assert items == [TextDelta("Hel"), TextDelta("lo")]
    assert error is not None
    assert (error.kind, error.retryable, error.status) == ("connection", True, None)


@pytest.mark.asyncio
async def test_dropped_inside_a_tool_call(server: ProviderServer, dialect: Dialect) -> None:
    cut = 3 if dialect is OPENAI else 4  # after the first argument fragment
    server.push(Reply(events=dialect.tools, drop_after=cut))
    async with dialect.make(server.url) as provider:
        items, error = await collect(provider)
    assert items == [
        ToolCallDelta(0, id="call_1", name="get_weather"),
        ToolCallDelta(0, arguments='{"ci'),
    ]
    assert error is not None and error.kind == "connection"


@pytest.mark.asyncio
@pytest.mark.parametrize("after_deltas", [0, 1])
async def test_stall_hits_the_idle_timeout(
    server: ProviderServer, dialect: Dialect, after_deltas: int
) -> None:
    stall = 0 if after_deltas == 0 else dialect.lead + after_deltas
    server.push(Reply(events=dialect.text("Hel", "lo"), stall_after=stall))
    async with dialect.make(server.url, timeout=httpx.Timeout(5.0, read=0.25)) as provider:
        items, error = await collect(provider)
    assert items == [TextDelta("Hel")][:after_deltas]
    assert error is not None
    assert (error.kind, error.retryable, error.status) == ("timeout", True, None)


@pytest.mark.asyncio
async def test_connection_refused(dialect: Dialect) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with dialect.make(f"http://127.0.0.1:{port}") as provider:
        items, error = await collect(provider)
    assert items == []
    assert error is not None and (error.kind, error.retryable) == ("connection", True)


@pytest.mark.asyncio
async def test_openai_finish_without_done_is_complete(server: ProviderServer) -> None:
    events = openai_text("Hi")
    server.push(Reply(events=events[:-2], framing="close"))  # no usage chunk, no [DONE]
    server.push(Reply(events=events, drop_after=len(events) - 2))  # cut before usage
    async with OPENAI.make(server.url) as provider:
        assert await collect(provider) == ([TextDelta("Hi"), StreamEnd("end_turn")], None)
        assert await collect(provider) == ([TextDelta("Hi"), StreamEnd("end_turn")], None)


@pytest.mark.asyncio
async def test_openai_error_chunk_mid_stream(server: ProviderServer) -> None:
    error_chunk = sse({"error": {"message": "oops", "type": "server_error", "code": None}})
    server.push(Reply(events=[*openai_text("Hel")[:2], error_chunk]))
    async with OPENAI.make(server.url) as provider:
        items, error = await collect(provider)
    assert items == [TextDelta("Hel")]
    assert error is not None and (error.kind, error.status) == ("server", None)


@pytest.mark.asyncio
async def test_anthropic_error_event_mid_stream(server: ProviderServer) -> None:
    events = anthropic_text("Hel", "lo")[:4]
    server.push(Reply(events=[*events, anthropic_error_event("overloaded_error", "Overloaded")]))
    async with ANTHROPIC.make(server.url) as provider:
        items, error = await collect(provider)
    assert items == [TextDelta("Hel")]
    assert error is not None
    assert (error.kind, error.retryable, error.status) == ("overloaded", True, None)


# ------------------------------------------------------------------- stream variants


@pytest.mark.asyncio
async def test_openai_calls_that_share_wire_index_zero(server: ProviderServer) -> None:
    events = [
        openai_tool(0, "call_a", "f", '{"x": 1}'),
        openai_tool(0, "call_b", "g", "{}"),
        openai_chunk({}, "tool_calls"),
        DONE,
    ]
    server.push(Reply(events=events))
    async with OPENAI.make(server.url) as provider:
        items, _ = await collect(provider)
    assert calls(items) == {0: ("call_a", "f", '{"x": 1}'), 1: ("call_b", "g", "{}")}
    assert items[-1] == StreamEnd("tool_use")


@pytest.mark.asyncio
async def test_anthropic_skips_thinking_and_fills_empty_arguments(server: ProviderServer) -> None:
    events = [
        anthropic_start(),
        anthropic_block_start(0, {"type": "thinking", "thinking": ""}),
        anthropic_delta(0, {"type": "thinking_delta", "thinking": "Hmm."}),
        anthropic_delta(0, {"type": "signature_delta", "signature": "EqQB"}),
        anthropic_block_stop(0),
        anthropic_block_start(1, {"type": "text", "text": "Listing."}),
        anthropic_block_stop(1),
        anthropic_tool_start(2, "toolu_1", "list_files"),
        anthropic_json(2, ""),
        anthropic_block_stop(2),
        *anthropic_end("tool_use"),
    ]
    server.push(Reply(events=events))
    async with ANTHROPIC.make(server.url) as provider:
        items, error = await collect(provider)
    assert error is None
    assert items == [
        TextDelta("Listing."),
        ToolCallDelta(0, id="toolu_1", name="list_files"),
        ToolCallDelta(0, arguments="{}"),
        StreamEnd("tool_use", Usage(25, 15)),
    ]


@pytest.mark.asyncio
async def test_abandoned_stream_then_reuse(server: ProviderServer, dialect: Dialect) -> None:
    server.push(Reply(events=dialect.text("a", "b")), Reply(events=dialect.text("c")))
    async with dialect.make(server.url) as provider:
        async with aclosing(provider.stream(HELLO)) as stream:
            assert await anext(stream) == TextDelta("a")
        items, _ = await collect(provider)
    assert items == [TextDelta("c"), StreamEnd("end_turn", dialect.end)]


@pytest.mark.asyncio
async def test_borrowed_client_is_not_closed(server: ProviderServer, dialect: Dialect) -> None:
    server.push(Reply(events=dialect.text("x"), stall_after=0))
    async with httpx.AsyncClient() as client:
        async with dialect.make(server.url, client=client, timeout=0.25) as provider:
            _, error = await collect(provider)
        assert error is not None and error.kind == "timeout"  # per-request timeout applies
        assert not client.is_closed


# ---------------------------------------------------------------------- request bodies

CONVERSATION = ModelRequest(
    model="m-1",
    system="Be terse.",
    max_tokens=256,
    temperature=0.2,
    tools=(
        ToolSpec(name="get_weather", description="Weather now", parameters={"type": "object"}),
        ToolSpec(name="get_time"),
    ),
    messages=(
        Message(id="1", role="user", content="Weather and time in Paris?"),
        Message(
            id="2",
            role="assistant",
            content="Checking.",
            tool_calls=[
                {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                {"id": "call_2", "name": "get_time", "arguments": ""},
            ],
        ),
        Message(id="3", role="tool", content="18 C", tool_call_id="call_1"),
        Message(id="4", role="tool", content="14:05", tool_call_id="call_2"),
        Message(id="5", role="user", content="Thanks."),
    ),
)


@pytest.mark.asyncio
async def test_openai_request_body(server: ProviderServer) -> None:
    server.push(Reply(events=openai_text("ok")))
    options: dict[str, Any] = {"headers": {"x-extra": "1"}, "extra_body": {"seed": 7}}
    options["max_tokens_param"] = "max_completion_tokens"
    async with OPENAI.make(server.url, **options) as provider:
        await collect(provider, CONVERSATION)
    [received] = server.received
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == "Bearer sk-test"
    assert received.headers["accept"] == "text/event-stream"
    assert received.headers["x-extra"] == "1"
    assert received.body == {
        "model": "m-1",
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_time", "arguments": ""}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
            {"role": "user", "content": "Thanks."},
        ],
        "max_completion_tokens": 256,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                              "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "get_time",
                                              "parameters": {"type": "object"}}},
        ],
        "seed": 7,
    }  # fmt: skip


@pytest.mark.asyncio
async def test_anthropic_request_body(server: ProviderServer) -> None:
    server.push(Reply(events=anthropic_text("ok")))
    async with ANTHROPIC.make(server.url, headers={"anthropic-beta": "b1"}) as provider:
        await collect(provider, CONVERSATION)
    [received] = server.received
    assert received.path == "/v1/messages"
    assert received.headers["x-api-key"] == "sk-ant"
    assert received.headers["anthropic-version"] == "2023-06-01"
    assert received.headers["anthropic-beta"] == "b1"
    assert "authorization" not in received.headers
    assert received.body == {
        "model": "m-1",
        "max_tokens": 256,
        "system": "Be terse.",
        "messages": [
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather",
                 "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18 C"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "14:05"},
            ]},
            {"role": "user", "content": "Thanks."},
        ],
        "stream": True,
        "temperature": 0.2,
        "tools": [
            {"name": "get_weather", "description": "Weather now",
             "input_schema": {"type": "object"}},
            {"name": "get_time", "input_schema": {"type": "object"}},
        ],
    }  # fmt: skip


@pytest.mark.asyncio
async def test_adapter_model_when_request_has_none(
    server: ProviderServer, dialect: Dialect
) -> None:
    server.push(Reply(events=dialect.text("ok")))
    async with dialect.make(server.url) as provider:
        await collect(provider, HELLO)
    assert server.bodies[0]["model"] in ("gpt-4o", "claude-sonnet-4-5")


@pytest.mark.asyncio
async def test_anthropic_refuses_non_object_arguments(server: ProviderServer) -> None:
    bad = Message(
        id="2", role="assistant", tool_calls=[{"id": "c", "name": "f", "arguments": "[1"}]
    )
    async with ANTHROPIC.make(server.url) as provider:
        _, error = await collect(provider, ModelRequest(model="m", messages=(bad,)))
    assert error is not None and error.kind == "invalid_request"
    assert server.received == []


def test_importing_providers_does_not_import_httpx() -> None:
    code = (
        "import sys, wakeful.providers as p\n"
        "assert 'httpx' not in sys.modules\n"
        "assert p.OpenAIChat.__name__ == 'OpenAIChat' and 'httpx' in sys.modules\n"
        "assert p.AnthropicMessages.__module__ == 'wakeful.providers.anthropic'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------- SSE parser


def parse(*chunks: bytes | str) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return [event for chunk in chunks for event in decoder.feed(chunk)] + decoder.close()


def test_sse_fields_and_multiline_data() -> None:
    stream = b"event: a\ndata: one\ndata:two\ndata:  three\nid: 7\nretry: 10\nfoo: x\n\n"
    assert parse(stream) == [SSEEvent("a", "one\ntwo\n three", "7")]
    assert parse(b"data\n\n") == [SSEEvent("message", "")]  # a field name alone


def test_sse_comments_and_events_without_data() -> None:
    stream = b": keep-alive\n\nevent: ignored\n\n: note\ndata: x\n\n"
    assert parse(stream) == [SSEEvent("message", "x")]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_sse_line_endings(newline: str) -> None:
    n = newline
    stream = f"event: e{n}data: 1{n}data: 2{n}{n}data: 3{n}{n}".encode()
    expected = [SSEEvent("e", "1\n2"), SSEEvent("message", "3")]
    assert parse(stream) == expected
    assert parse(*(stream[i : i + 1] for i in range(len(stream)))) == expected


def test_sse_cr_lf_split_across_chunks_is_one_line_end() -> None:
    assert parse(b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n") == [
        SSEEvent("message", "a"),
        SSEEvent("message", "b"),
    ]


def test_sse_utf8_split_bom_and_unfinished_event() -> None:
    stream = "\ufeffdata: ça 👋\n\ndata: never dispatched\n".encode()
    assert parse(*(stream[i : i + 1] for i in range(len(stream)))) == [SSEEvent("message", "ça 👋")]


# ------------------------------------------------------------- Retry-After, classify

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        ("1.5", 1.5),
        ("0", 0.0),
        (email.utils.formatdate(NOW + 30, usegmt=True), 30.0),
        (email.utils.formatdate(NOW - 30, usegmt=True), 0.0),
        ("soon", None),
        ("", None),
        ("-5", None),
        ("1e3", None),
        ("nan", None),
        ("Mon, 99 Foo 2024 25:61:00 GMT", None),
        (None, None),
    ],
)
def test_parse_retry_after(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


def test_retry_after_ms_wins() -> None:
    assert header_hint(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert header_hint(httpx.Headers({"retry-after-ms": "x", "retry-after": "9"})) == 9.0
    assert header_hint(httpx.Headers({})) is None


@pytest.mark.parametrize(
    ("status", "type", "code", "kind"),
    [
        (503, "overloaded_error", None, "overloaded"),
        (503, None, None, "server"),
        (529, None, None, "overloaded"),
        (400, "invalid_request_error", "context_length_exceeded", "context_overflow"),
        (400, "invalid_request_error", None, "invalid_request"),
        (402, "billing_error", None, "auth"),
        (422, None, None, "invalid_request"),
        (404, "invalid_request_error", "model_not_found", "not_found"),
        (429, "insufficient_quota", "insufficient_quota", "auth"),  # retrying buys no credits
        (402, None, None, "auth"),
        (None, None, "502", "server"),  # an in-stream code that is an HTTP status
        (None, None, "429", "rate_limited"),
        (None, "invalid_request_error", "400", "invalid_request"),
        (None, "exceed_context_size_error", "400", "context_overflow"),  # llama.cpp
        (None, "overloaded_error", None, "overloaded"),
        (None, "rate_limit_error", None, "rate_limited"),
        (None, "api_error", None, "server"),
        (None, "invalid_request_error", None, "invalid_request"),
        (None, "something_new", None, "server"),
    ],
)
def test_classify(status: int | None, type: str | None, code: str | None, kind: str) -> None:
    assert classify(status, type, code) == kind


def test_error_bodies_are_real_json() -> None:
    assert json.loads(openai_error("x", "y"))["error"]["code"] == "y"
    assert json.loads(anthropic_error("x"))["error"]["type"] == "x"
