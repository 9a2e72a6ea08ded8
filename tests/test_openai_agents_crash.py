"""Two Agents SDK agents handing off survive a SIGKILL between a tool's start and its
recorded result: the handoff and billing's turn are not asked again, the ``never`` tool is
not run again (Indeterminate), the ``safe`` one is."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

pytest.importorskip("agents")

from tests.oai_child import runner, team
from tests.oai_stream_child import runner as stream_runner
from tests.oai_stream_child import writer
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
from wakeful.agent.agent import INDETERMINATE
from wakeful.runtime import ClaimPolicy, Runtime


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_handoff_and_never_tool_survive_a_sigkill(kind: str, tmp_path: Path) -> None:
    url = store_url(kind, tmp_path)
    ready = [tmp_path / "refund.started", tmp_path / "lookup.started"]
    await asyncio.to_thread(kill_when_ready, ["tests.oai_child", url, str(tmp_path)], ready)

    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
    store = await open_store(url, clock=clock)
    try:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="parent")
        triage, triage_model, billing_model = team(tmp_path, hang=False, replayed=True)
        result = await runner(runtime).recover(triage, "t")
        assert (result.status, result.final_output) == ("completed", "Refund handled.")
        assert result.last_agent.name == "billing"
        assert len(triage_model.calls) == 0, "the committed handoff turn was not asked again"
        assert len(billing_model.calls) == 1, "only the answer after the tools"
        effects = (tmp_path / "effects.txt").read_text().split()
        assert effects.count("refund") == 1, "never: not run again"
        assert effects.count("lookup") == 2, "safe: ran again"
        messages = await store.messages("t", 0, 100)
        tools = {m.tool_call_id: m for m in messages if m.role == "tool"}
        assert tools["c-refund"].content == INDETERMINATE
        assert tools["c-refund"].metadata["outcome"] == "indeterminate"
        assert tools["c-lookup"].content == "lookup done"
        assert [m.role for m in messages] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "tool",
            "assistant",
        ]
    finally:
        await store.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_sigkill_mid_answer_is_continued_not_regenerated(kind: str, tmp_path: Path) -> None:
    url = store_url(kind, tmp_path)
    with ProviderServer() as server:
        call = [
            openai_chunk({"role": "assistant", "content": None}),
            openai_tool(0, "c-charge", "charge", '{"amount": 5}'),
            openai_chunk({}, "tool_calls"),
            openai_usage(5, 5),
            b"data: [DONE]\n\n",
        ]
        server.push(
            Reply(events=call), Reply(events=openai_text("Once ", "upon ", "a "), stall_after=4)
        )
        argv = ["tests.oai_stream_child", url, server.url, str(tmp_path)]
        await asyncio.to_thread(kill_when_ready, argv, [tmp_path / "ready"])
        run_id = (tmp_path / "ready").read_text()
        server.push(Reply(events=openai_text("time.")))

        clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
        store = await open_store(url, clock=clock)
        try:
            runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="new")
            agent, client = writer(server.url, tmp_path)
            result = await stream_runner(runtime).recover(agent, "t")
            assert (result.status, result.final_output) == ("completed", "Once upon a time.")
            assert len(server.bodies) == 3, "one continued request after the crash"
            continuation = server.bodies[2]["messages"]
            assert continuation[-2] == {"role": "assistant", "content": "Once upon a "}
            assert continuation[-1]["role"] == "user"
            assert (tmp_path / "effects.txt").read_text() == "charge 5\n", "never ran once"
            messages = await store.messages("t", 0, 100)
            assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
            assert messages[3].metadata["recoveries"][:2] == ["resumed", "R1"]
            assert await store.stream_checkpoints.get(run_id) is None
            await client.close()
        finally:
            await store.close()
