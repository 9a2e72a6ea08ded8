"""Live streams through the framework wrappers: ``WakefulAgent.run_stream`` / ``iter`` and
``WakefulRunner.run_streamed`` hand out the frameworks' own stream objects whose first text
delta arrives while the provider still holds its stream open (the loopback server waits
for the test before sending the rest), while the durable run checkpoints it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from tests.provider_server import ProviderServer, Reply, openai_text
from tests.pydai_child import writer
from tests.runtime_support import eventually
from wakeful.runtime import Runtime
from wakeful.store.memory import MemoryStore


async def checkpointed(store: MemoryStore, thread: str, text: str) -> bool:
    """Whether the thread's running run has a stream checkpoint holding ``text``."""
    messages = await store.messages(thread, 0, 10)
    if not messages:
        return False
    saved = await store.stream_checkpoints.get(str(messages[0].run_id))
    return saved is not None and saved.partial_text == text


@pytest.mark.asyncio
async def test_pydantic_ai_run_stream_yields_deltas_before_the_model_stream_ends() -> None:
    with ProviderServer() as server:
        server.push(Reply(events=openai_text("Once ", "upon ", "a time."), gate_after=3))
        store = MemoryStore()
        wa = writer(server.url)
        order: list[str] = []
        async with wa.run_stream("Tell me a story", thread_id="t", runtime=Runtime(store)) as s:
            deltas = s.stream_text(delta=True, debounce_by=None)
            first = await anext(deltas)
            order.append(f"delta {first}")
            # the provider has not sent the rest: the gate is closed until now
            await eventually(lambda: checkpointed(store, "t", "Once upon "))
            order.append("checkpointed")
            server.release.set()
            order.append("released")
            order.extend([f"delta {d}" async for d in deltas])
            output = await s.get_output()
        assert order[:3] == ["delta Once ", "checkpointed", "released"]
        assert "".join(o.removeprefix("delta ") for o in order if o.startswith("delta")) == (
            "Once upon a time."
        )
        assert output == "Once upon a time."
        assert len(server.bodies) == 1, "one model request: the mirror paid for nothing"
        messages = await store.messages("t", 0, 10)
        assert [m.role for m in messages] == ["user", "assistant"]
        assert messages[1].content == "Once upon a time."
        snap = await store.read("t")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.status == "completed", "the durable run ended with the block"


@pytest.mark.asyncio
async def test_pydantic_ai_iter_follows_the_durable_run_node_by_node() -> None:
    with ProviderServer() as server:
        server.push(Reply(events=openai_text("Hello ", "there.")))
        store = MemoryStore()
        wa = writer(server.url)
        async with wa.iter("hi", thread_id="t", runtime=Runtime(store)) as run:
            nodes: list[Any] = [type(node).__name__ async for node in run]
        assert run.result is not None and run.result.output == "Hello there."
        assert nodes[-1] == "End" and nodes.count("ModelRequestNode") == 1
        assert len(server.bodies) == 1
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_agents_sdk_run_streamed_yields_deltas_before_the_model_stream_ends(
    tmp_path: Path,
) -> None:
    pytest.importorskip("agents")
    from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent

    from tests.oai_stream_child import runner, writer
    from tests.provider_server import openai_chunk, openai_tool, openai_usage

    with ProviderServer() as server:
        call = [
            openai_chunk({"role": "assistant", "content": None}),
            openai_tool(0, "c-charge", "charge", '{"amount": 5}'),
            openai_chunk({}, "tool_calls"),
            openai_usage(5, 5),
            b"data: [DONE]\n\n",
        ]
        story = Reply(events=openai_text("Once ", "upon ", "a time."), gate_after=3)
        server.push(Reply(events=call), story)
        store = MemoryStore()
        agent, client = writer(server.url, tmp_path)
        result = runner(Runtime(store)).run_streamed(agent, "Charge 5, then a story", thread_id="t")
        order: list[str] = []
        async for event in result.stream_events():
            if isinstance(event, RawResponsesStreamEvent):
                order.append(f"delta {event.data.delta}")  # type: ignore[union-attr]
                if not server.release.is_set():
                    await eventually(lambda: checkpointed(store, "t", "Once upon "))
                    order.append("checkpointed")
                    server.release.set()
            elif isinstance(event, RunItemStreamEvent):
                order.append(event.name)
        await client.close()
    assert order == [
        "tool_called",
        "tool_output",
        "delta Once ",
        "checkpointed",
        "delta upon ",
        "delta a time.",
        "message_output_created",
    ]
    assert result.is_complete and result.final_output == "Once upon a time."
    assert (tmp_path / "effects.txt").read_text() == "charge 5\n"
    assert len(server.bodies) == 2


@pytest.mark.asyncio
async def test_pydantic_ai_run_stream_over_a_tool_call_runs_the_tool_once(tmp_path: Path) -> None:
    from tests.provider_server import openai_chunk, openai_tool, openai_usage

    with ProviderServer() as server:
        call = [
            openai_chunk({"role": "assistant", "content": None}),
            openai_tool(0, "c-charge", "charge", '{"amount": 5}'),
            openai_chunk({}, "tool_calls"),
            openai_usage(5, 5),
            b"data: [DONE]\n\n",
        ]
        story = Reply(events=openai_text("Charged ", "5."), gate_after=2)
        server.push(Reply(events=call), story)
        store = MemoryStore()
        wa = writer(server.url, tmp_path)
        async with wa.run_stream("Charge 5", thread_id="t", runtime=Runtime(store)) as s:
            deltas = s.stream_text(delta=True, debounce_by=None)
            first = await anext(deltas)
            server.release.set()
            rest = [d async for d in deltas]
            messages = s.all_messages()
        assert first == "Charged " and "".join([first, *rest]) == "Charged 5."
        assert (tmp_path / "effects.txt").read_text() == "charge 5\n", "the mirror ran nothing"
        assert len(server.bodies) == 2
        kinds = [p.part_kind for m in messages for p in m.parts]
        assert kinds.count("tool-return") == 1 and kinds[-1] == "text"
        roles = [m.role for m in await store.messages("t", 0, 10)]
        assert roles == ["user", "assistant", "tool", "assistant"]
