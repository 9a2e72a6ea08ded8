"""Stream recovery plans R2 and R3 (seed 000) through the framework wrappers, after a real
SIGKILL mid-answer (children ``tests.pydai_child stream`` and ``tests.oai_stream_child``):

- R2, a complete tool call had arrived: the text and the complete calls are the turn, the
  model is not asked again for it, the unfinished call is dropped;
- R3, text and an unfinished tool call: the call is dropped, the text is continued by one
  continuation request.

The Agents SDK's chat-completions model surfaces a function call only once the stream
ends, so for it an unfinished call is never seen: the text is continued (plan R1), which is
R3's outcome; a model that surfaces a complete call before its stream ends (the Responses
API's ``output_item.done``; here the SDK's ``ScriptedModel``, ``tests.oai_r2_child``) gets
R2."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from tests.provider_server import (
    ProviderServer,
    Reply,
    openai_chunk,
    openai_text,
    openai_tool,
    openai_usage,
)
from tests.runtime_support import kill_when_ready, store_url
from wakeful import ManualClock, open_store
from wakeful.records import Message
from wakeful.runtime import ClaimPolicy, Runtime

CLOSE = [openai_chunk({}, "tool_calls"), openai_usage(5, 5), b"data: [DONE]\n\n"]
ROLE = openai_chunk({"role": "assistant", "content": None})


async def recover_pydai(
    url: str, server: ProviderServer, directory: Path
) -> tuple[str, list[Message]]:
    from tests.pydai_child import writer

    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
    store = await open_store(url, clock=clock)
    try:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="new")
        result = await writer(server.url, directory).recover("t", runtime=runtime)
        return str(result.output), list(await store.messages("t", 0, 100))
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_pydantic_ai_r2_keeps_the_complete_call_and_asks_nothing_again(
    tmp_path: Path,
) -> None:
    url = store_url("sqlite", tmp_path)
    ready = tmp_path / "ready"
    with ProviderServer() as server:
        first = [
            ROLE,
            openai_tool(0, "c-charge", "charge", '{"amount": 5}'),
            openai_tool(1, "c-more", "charge", '{"amo'),
            *CLOSE,
        ]
        server.push(Reply(events=first, stall_after=3))
        argv = ["tests.pydai_child", "stream", url, server.url, str(ready), "calls"]
        await asyncio.to_thread(kill_when_ready, argv, [ready])
        server.push(Reply(events=openai_text("Charged 5.")))
        output, messages = await recover_pydai(url, server, tmp_path)
    assert output == "Charged 5."
    assert len(server.bodies) == 2, "the cut turn was not asked again: only the answer after"
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert [c["id"] for c in messages[1].tool_calls] == ["c-charge"], "the partial call dropped"
    assert messages[1].metadata["recoveries"] == ["resumed", "R2"]
    assert messages[2].content == "charged 5"
    assert (tmp_path / "effects.txt").read_text() == "charge 5\n", "ran once, after recovery"


@pytest.mark.asyncio
async def test_pydantic_ai_r3_drops_the_unfinished_call_and_continues_the_text(
    tmp_path: Path,
) -> None:
    url = store_url("sqlite", tmp_path)
    ready = tmp_path / "ready"
    with ProviderServer() as server:
        first = [
            openai_chunk({"role": "assistant", "content": "I will charge "}),
            openai_tool(0, "c-charge", "charge", '{"amo'),
            *CLOSE,
        ]
        server.push(Reply(events=first, stall_after=2))
        argv = ["tests.pydai_child", "stream", url, server.url, str(ready), "text-call"]
        await asyncio.to_thread(kill_when_ready, argv, [ready])
        server.push(Reply(events=openai_text("you nothing.")))
        output, messages = await recover_pydai(url, server, tmp_path)
        continuation = server.bodies[1]["messages"]
    assert output == "I will charge you nothing."
    assert len(server.bodies) == 2, "one continuation request"
    assert continuation[-2] == {"role": "assistant", "content": "I will charge "}
    assert continuation[-1]["role"] == "user"
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].tool_calls == [], "the unfinished call was dropped"
    assert messages[1].metadata["recoveries"] == ["resumed", "R3"]
    assert not (tmp_path / "effects.txt").exists()


@pytest.mark.asyncio
async def test_agents_sdk_text_with_an_unfinished_call_is_continued(tmp_path: Path) -> None:
    pytest.importorskip("agents")
    from tests.oai_stream_child import runner, writer

    url = store_url("sqlite", tmp_path)
    with ProviderServer() as server:
        call = [ROLE, openai_tool(0, "c-charge", "charge", '{"amount": 5}'), *CLOSE]
        cut = [
            openai_chunk({"role": "assistant", "content": "Once upon "}),
            openai_tool(0, "c-again", "charge", '{"amo'),
            *CLOSE,
        ]
        server.push(Reply(events=call), Reply(events=cut, stall_after=2))
        argv = ["tests.oai_stream_child", url, server.url, str(tmp_path), "Once upon "]
        await asyncio.to_thread(kill_when_ready, argv, [tmp_path / "ready"])
        server.push(Reply(events=openai_text("a time.")))
        clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
        store = await open_store(url, clock=clock)
        try:
            runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="new")
            agent, client = writer(server.url, tmp_path)
            result = await runner(runtime).recover(agent, "t")
            messages = await store.messages("t", 0, 100)
            await client.close()
        finally:
            await store.close()
        continuation = server.bodies[2]["messages"]
    assert (result.status, result.final_output) == ("completed", "Once upon a time.")
    assert len(server.bodies) == 3, "one continuation request"
    assert continuation[-2] == {"role": "assistant", "content": "Once upon "}
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[3].tool_calls == [], "the unfinished call never reached the turn"
    assert messages[3].metadata["recoveries"][:2] == ["resumed", "R1"]
    assert (tmp_path / "effects.txt").read_text() == "charge 5\n"


@pytest.mark.asyncio
async def test_agents_sdk_r2_keeps_a_complete_call_streamed_before_the_cut(
    tmp_path: Path,
) -> None:
    pytest.importorskip("agents")
    from tests.oai_r2_child import agent, runner

    url = store_url("sqlite", tmp_path)
    argv = ["tests.oai_r2_child", url, str(tmp_path)]
    await asyncio.to_thread(kill_when_ready, argv, [tmp_path / "ready"])
    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
    store = await open_store(url, clock=clock)
    try:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="new")
        sdk, model = agent(tmp_path, recovering=True)
        result = await runner(runtime).recover(sdk, "t")
        messages = await store.messages("t", 0, 100)
    finally:
        await store.close()
    assert (result.status, result.final_output) == ("completed", "Charged 5.")
    assert len(model.calls) == 1, "the cut turn was not asked again: only the answer after"
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert [c["id"] for c in messages[1].tool_calls] == ["c-charge"]
    assert messages[1].metadata["recoveries"][:2] == ["resumed", "R2"]
    assert (tmp_path / "effects.txt").read_text() == "charge 5\n", "ran once, after recovery"
