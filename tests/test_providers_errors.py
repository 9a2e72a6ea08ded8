"""Failures the adapters must never turn into answers (issue 25): an error chunk inside a 200
stream, a quota that retrying cannot buy, cumulative Anthropic usage, and errors that say
which request failed and where a timeout struck. The byte sequences are the ones the issue
reports; the agent tests run the whole agent against the local wire-format server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.provider_server import (
    ProviderServer,
    Reply,
    anthropic_block_start,
    anthropic_delta,
    anthropic_text,
    openai_text,
    recorded,
    sse,
)
from wakeful import ManualClock
from wakeful.agent import Agent, StreamPolicy, tool
from wakeful.providers import (
    AnthropicMessages,
    ModelRequest,
    OpenAIChat,
    ProviderError,
    StreamEnd,
    StreamItem,
    TextDelta,
    Usage,
)
from wakeful.providers.http import SSEDecoder, SSEEvent, error_from_transport
from wakeful.records import Message
from wakeful.runtime import Runtime
from wakeful.store.memory import MemoryStore

HELLO = ModelRequest(model="", messages=(Message(id="m1", role="user", content="Hi"),))

# The exact bytes of issue 25: OpenRouter reporting an upstream failure mid-stream.
OPENROUTER_PARTIAL = (
    b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"Partial ans"},'
    b'"finish_reason":null}]}\n\n'
)
OPENROUTER_ERROR = (
    b'data: {"id":"x","error":{"code":502,"message":"Provider disconnected unexpectedly"},'
    b'"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}\n\n'
)
DONE = b"data: [DONE]\n\n"


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as srv:
        yield srv


def openai(url: str, **kw: Any) -> OpenAIChat:
    return OpenAIChat("gpt-4o", base_url=f"{url}/v1", api_key="sk-test", **kw)


def anthropic(url: str, **kw: Any) -> AnthropicMessages:
    return AnthropicMessages("claude-sonnet-4-5", base_url=url, api_key="sk-ant", **kw)


async def collect(
    provider: OpenAIChat | AnthropicMessages, request: ModelRequest = HELLO
) -> tuple[list[StreamItem], ProviderError | None]:
    items: list[StreamItem] = []
    try:
        async for item in provider.stream(request):
            items.append(item)
    except ProviderError as exc:
        return items, exc
    return items, None


# ---------------------------------------------------------- error chunks in a 200 stream


@pytest.mark.asyncio
async def test_openrouter_error_chunk_is_a_retryable_error_not_a_finished_turn(
    server: ProviderServer,
) -> None:
    server.push(Reply(events=[OPENROUTER_PARTIAL, OPENROUTER_ERROR, DONE]))
    async with openai(server.url) as provider:
        items, error = await collect(provider)
    assert items == [TextDelta("Partial ans")], "no StreamEnd: the turn did not finish"
    assert error is not None
    assert (error.kind, error.retryable, error.status) == ("server", True, None)
    assert "Provider disconnected unexpectedly" in error.detail


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("code", "kind", "retryable"),
    [
        (429, "rate_limited", True),
        (400, "invalid_request", False),
        ("server_error", "server", True),
    ],
)
async def test_the_error_code_decides_whether_it_is_retryable(
    server: ProviderServer, code: int | str, kind: str, retryable: bool
) -> None:
    chunk = {
        "id": "x",
        "error": {"code": code, "message": "upstream said no"},
        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
    }
    server.push(Reply(events=[OPENROUTER_PARTIAL, sse(chunk), DONE]))
    async with openai(server.url) as provider:
        items, error = await collect(provider)
    assert items == [TextDelta("Partial ans")]
    assert error is not None and (error.kind, error.retryable) == (kind, retryable)


@pytest.mark.asyncio
async def test_finish_reason_error_without_an_error_object_is_an_error(
    server: ProviderServer,
) -> None:
    chunk = {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]}
    server.push(Reply(events=[OPENROUTER_PARTIAL, sse(chunk), DONE]))
    async with openai(server.url) as provider:
        items, error = await collect(provider)
    assert items == [TextDelta("Partial ans")]
    assert error is not None and (error.kind, error.retryable) == ("server", True)


POLICY = StreamPolicy(checkpoint_every_deltas=1, checkpoint_min_interval=0, idle_timeout=5)


class NoSleep:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def run_agent(server: ProviderServer, tools: list[Any]) -> tuple[Any, list[Message]]:
    store = MemoryStore(ManualClock())
    async with openai(server.url) as provider:
        agent = Agent("helper", provider, "Be brief.", tools, stream_policy=POLICY, sleep=NoSleep())
        reply = await agent.run(Runtime(store), "t", "What is the answer?")
    return reply, await store.messages("t", 0, 100)


@pytest.mark.asyncio
async def test_agent_continues_after_the_openrouter_error_instead_of_committing_it(
    server: ProviderServer,
) -> None:
    server.push(
        Reply(events=[OPENROUTER_PARTIAL, OPENROUTER_ERROR, DONE]),
        Reply(events=openai_text("wer is 42.")),
    )
    reply, messages = await run_agent(server, [])
    assert reply.status == "completed"
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == "Partial answer is 42.", "not 'Partial ans'"
    assert messages[1].metadata["recoveries"] == ["R1"]
    continuation = server.bodies[1]["messages"]
    assert continuation[-2] == {"role": "assistant", "content": "Partial ans"}
    assert continuation[-1]["role"] == "user"


@pytest.mark.asyncio
async def test_agent_drops_a_tool_call_cut_by_the_openrouter_error(
    server: ProviderServer,
) -> None:
    ran: list[str] = []

    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        ran.append(city)
        return "clear"

    half_call = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"city": "Pa'},
                        }
                    ]
                },
                "finish_reason": None,
            }
        ],
    }
    server.push(
        Reply(events=[sse(half_call), OPENROUTER_ERROR, DONE]),
        Reply(events=openai_text("Fresh answer.")),
    )
    reply, messages = await run_agent(server, [lookup])
    assert ran == [], "the half-written call never ran"
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == "Fresh answer." and messages[1].tool_calls == []
    assert messages[1].metadata["recoveries"] == ["R4"]
    assert server.bodies[1]["messages"] == server.bodies[0]["messages"], "a restart"
    assert reply.text == "Fresh answer."


# ------------------------------------------------------------------------------ quota


@pytest.mark.asyncio
async def test_insufficient_quota_is_permanent_and_says_so(server: ProviderServer) -> None:
    body = recorded("openai/insufficient_quota").body  # OpenAI's bytes
    server.push(Reply(status=429, body=body, headers=[("x-request-id", "req_q1")]))
    async with openai(server.url) as provider:
        items, error = await collect(provider)
    assert items == []
    assert error is not None
    assert (error.kind, error.retryable, error.status) == ("auth", False, 429)
    assert "quota" in error.detail and "credits" in error.detail
    assert "req_q1" in error.detail


@pytest.mark.asyncio
async def test_openrouter_402_insufficient_credits_is_permanent(server: ProviderServer) -> None:
    body = b'{"error":{"code":402,"message":"Insufficient credits. Add more using https://openrouter.ai/credits"}}'
    server.push(Reply(status=402, body=body))
    async with openai(server.url) as provider:
        _, error = await collect(provider)
    assert error is not None and (error.kind, error.retryable) == ("auth", False)
    assert "credits" in error.detail


# ---------------------------------------------------------------- Anthropic usage


def anthropic_usage_turn(start: dict[str, int], delta: dict[str, int]) -> list[bytes]:
    message: dict[str, Any] = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start,
    }
    return [
        sse({"type": "message_start", "message": message}, "message_start"),
        anthropic_block_start(0, {"type": "text", "text": ""}),
        anthropic_delta(0, {"type": "text_delta", "text": "Hi"}),
        sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": delta,
            },
            "message_delta",
        ),
        sse({"type": "message_stop"}, "message_stop"),
    ]


CACHED_START = {
    "input_tokens": 10,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 4200,
    "output_tokens": 1,
}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "delta",
    [
        {"input_tokens": 10, "output_tokens": 15},  # the issue: no cache fields in the delta
        {"output_tokens": 15},
        {**CACHED_START, "output_tokens": 15},  # a delta that repeats every field
    ],
)
async def test_anthropic_usage_fields_merge_cumulatively(
    server: ProviderServer, delta: dict[str, int]
) -> None:
    server.push(Reply(events=anthropic_usage_turn(CACHED_START, delta)))
    async with anthropic(server.url) as provider:
        items, error = await collect(provider)
    assert error is None
    assert items[-1] == StreamEnd("end_turn", Usage(4210, 15))


# -------------------------------------------------- request ids and timeout phases


@pytest.mark.asyncio
async def test_stream_errors_carry_the_request_id(server: ProviderServer) -> None:
    cut = openai_text("Hel", "lo")
    server.push(Reply(events=cut, drop_after=2, headers=[("x-request-id", "req_cut")]))
    error_chunk = sse({"error": {"message": "oops", "type": "server_error"}})
    server.push(Reply(events=[*cut[:2], error_chunk], headers=[("x-request-id", "req_chunk")]))
    async with openai(server.url) as provider:
        _, dropped = await collect(provider)
        _, reported = await collect(provider)
    assert dropped is not None and dropped.kind == "connection"
    assert "req_cut" in dropped.detail
    assert reported is not None and reported.kind == "server"
    assert "req_chunk" in reported.detail and "oops" in reported.detail

    events = anthropic_text("Hel", "lo")
    server.push(Reply(events=events, drop_after=4, headers=[("request-id", "req_011CS")]))
    async with anthropic(server.url) as provider:
        _, truncated = await collect(provider)
    assert truncated is not None and truncated.kind == "connection"
    assert "req_011CS" in truncated.detail


@pytest.mark.asyncio
@pytest.mark.parametrize(("stall", "phase"), [(0, "first byte"), (2, "between chunks")])
async def test_a_timeout_says_where_it_struck_and_how_long_it_waited(
    server: ProviderServer, stall: int, phase: str
) -> None:
    server.push(
        Reply(events=openai_text("Hel", "lo"), stall_after=stall, headers=[("x-request-id", "r9")])
    )
    async with openai(server.url, timeout=httpx.Timeout(5.0, read=0.25)) as provider:
        items, error = await collect(provider)
    assert items == [TextDelta("Hel")][: 1 if stall else 0]
    assert error is not None and error.kind == "timeout"
    assert phase in error.detail
    assert "0.25 s" in error.detail, error.detail  # the configured read timeout
    assert "r9" in error.detail


def test_a_connect_timeout_names_the_phase() -> None:
    timeout = httpx.Timeout(600.0, connect=10.0).as_dict()
    url = "https://api.example.com/v1/chat/completions"
    request = httpx.Request("POST", url, extensions={"timeout": timeout})
    error = error_from_transport(httpx.ConnectTimeout("timed out", request=request))
    assert error.kind == "timeout"
    assert "connect" in error.detail and "10 s" in error.detail


def test_the_sse_parser_keeps_llama_cpps_error_field() -> None:
    decoder = SSEDecoder()
    stream = b'data: {"a":1}\n\nerror: {"code":400,"message":"too long"}\n\ndata: [DONE]\n\n'
    assert decoder.feed(stream) == [
        SSEEvent("message", '{"a":1}'),
        SSEEvent("error", '{"code":400,"message":"too long"}'),
        SSEEvent("message", "[DONE]"),
    ]
