"""The servers people point ``OpenAIChat`` at, replayed byte for byte from
``tests/fixtures/providers/<server>/``: each recorded response is served by the local test
server (whole, and cut into 5-byte chunks) and must give what its ``.toml`` expects: the text,
the tool calls, the stop reason and usage, or the classified error; and the adapter must say
which workarounds it used."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.provider_server import Fixture, ProviderServer, fixtures, recorded
from wakeful.providers import (
    ModelRequest,
    OpenAIChat,
    ProviderError,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from wakeful.providers.http import Observation
from wakeful.records import Message

SERVERS = {"openai", "openrouter", "azure", "groq", "vllm", "llamacpp", "ollama", "lmstudio"}
SERVERS |= {"together"}
HELLO = ModelRequest(model="", messages=(Message(id="m1", role="user", content="Hi"),))
CASES = [
    pytest.param(f, size, id=f"{f.id}-{'whole' if size is None else 'split'}")
    for f in fixtures()
    for size in ([None, 5] if f.streamed else [None])
]


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as srv:
        yield srv


async def replay(
    server: ProviderServer, fixture: Fixture, chunk_size: int | None
) -> tuple[list[StreamItem], ProviderError | None, Observation]:
    server.push(fixture.reply(chunk_size))
    observation = Observation()
    items: list[StreamItem] = []
    async with OpenAIChat("model", base_url=f"{server.url}/v1", api_key="sk-test") as provider:
        try:
            async for item in provider.stream(HELLO, observation=observation):
                items.append(item)
        except ProviderError as exc:
            return items, exc, observation
    return items, None, observation


def tool_calls(items: list[StreamItem]) -> list[dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for item in items:
        if isinstance(item, ToolCallDelta):
            call = calls.setdefault(item.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = item.id or call["id"]
            call["name"] = item.name or call["name"]
            call["arguments"] += item.arguments
    return [calls[i] for i in sorted(calls)]


@pytest.mark.asyncio
@pytest.mark.parametrize(("fixture", "chunk_size"), CASES)
async def test_replayed_server_response(
    server: ProviderServer, fixture: Fixture, chunk_size: int | None
) -> None:
    expect: dict[str, Any] = fixture.meta["expect"]
    items, error, observation = await replay(server, fixture, chunk_size)
    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == expect.get("text", "")
    assert tool_calls(items) == expect.get("calls", [])
    ends = [i for i in items if isinstance(i, StreamEnd)]
    if "error" in expect:
        assert ends == [], "a failure must never end the turn"
        assert error is not None, "the failure was not reported"
        assert (error.kind, error.retryable) == (expect["error"], expect["retryable"])
        assert error.retry_after == expect.get("retry_after")
        for fragment in expect.get("detail", []):
            assert fragment in error.detail
    else:
        assert error is None, error
        assert len(ends) == 1 and items[-1] is ends[0]
        assert ends[0].stop_reason == expect["stop"]
        usage = ends[0].usage
        got = None if usage is None else [usage.input_tokens, usage.output_tokens]
        assert got == expect.get("usage")
    for fragment in expect.get("workarounds", []):
        assert any(fragment in w for w in observation.workarounds), observation.workarounds


def test_every_server_is_covered_and_every_quirk_has_a_source() -> None:
    found = fixtures()
    assert {f.server for f in found} == SERVERS
    for f in found:
        assert f.meta.get("quirk") and f.meta.get("source"), f.id
        assert "expect" in f.meta, f.id


@pytest.mark.asyncio
async def test_azure_deployment_url_with_api_version_and_api_key_header(
    server: ProviderServer,
) -> None:
    server.push(recorded("azure/content_filter_chunks").reply())
    base_url = f"{server.url}/openai/deployments/gpt-4o"
    options: dict[str, Any] = {
        "headers": {"api-key": "azk"},
        "params": {"api-version": "2024-10-21"},
    }
    async with OpenAIChat("gpt-4o", base_url=base_url, api_key="", **options) as provider:
        items = [item async for item in provider.stream(HELLO)]
    received = server.received[-1]
    assert received.path == "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"
    assert received.headers["api-key"] == "azk"
    assert "authorization" not in received.headers
    assert items[-1] == StreamEnd("end_turn", Usage(11, 3))
