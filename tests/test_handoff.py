"""``handoff`` (issue 43, item 2: ``handoff``/``delegate`` to another registered agent): the
other agent gets the conversation, and its reply is the calling agent's final answer (no
second model turn of the calling agent), unlike ``delegate`` whose reply is a tool result
the calling agent's model reads. Workers in this process over the memory, file and SQLite
stores (the SIGKILL test is tests/test_children_processes.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.runtime_support import STORE_KINDS, open_kind
from tests.test_children import Env
from wakeful import ManualClock
from wakeful.agent import Agent, delegate, handoff
from wakeful.agent.delegation import transcript
from wakeful.fleet import submit
from wakeful.providers.scripted import Scripted, calls, reply
from wakeful.records import Message
from wakeful.runtime.children import ChildRun


@pytest_asyncio.fixture(params=STORE_KINDS)
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    async with await open_kind(request.param, tmp_path, clock) as store:
        environment = Env(store, clock)
        try:
            yield environment
        finally:
            await environment.close()


@pytest.mark.asyncio
async def test_a_handoff_ends_the_calling_agents_run_with_the_other_agents_reply(
    env: Env,
) -> None:
    desk_model = Scripted.of(
        calls(("c1", "transfer_to_billing", {"request": "Refund order 42."})),
        reply("never asked: the run ends with the handoff"),
    )
    billing_model = Scripted.of(reply("Refunded order 42."))
    desk = Agent("desk", desk_model, "Route the user.", [handoff("billing")])
    env.registry.add("desk", desk)
    env.registry.add("billing", Agent("billing", billing_model, "Handle billing."))
    env.worker("w1")
    await submit(env.store, "chat", "desk", "I want my money back", dispatch_id="d1", wake=env.wake)
    done = await env.ended("chat")
    assert done.state["final"] == "Refunded order 42."
    assert len(desk_model.requests) == 1, "no model turn after the handoff"
    assert len(billing_model.requests) == 1
    events = await env.store.events_after("chat", 0, 1000)
    (kid,) = [ChildRun.of(e.data) for e in events if e.type == "child.spawned"]
    assert kid.target == "billing"
    (handed,) = [e.data for e in events if e.type == "agent.handed_off"]
    assert handed == {
        "call_id": "c1",
        "target": "billing",
        "thread_id": kid.thread_id,
        "run_id": kid.run_id,
    }
    messages = await env.store.messages("chat")
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2].content == "Refunded order 42."
    assert messages[2].metadata["outcome"] == "ok"
    assert messages[3].content == "Refunded order 42."
    assert messages[3].metadata["handoff"]["run_id"] == kid.run_id
    # the other agent got the request and the conversation so far
    (asked,) = [m for m in await env.store.messages(kid.thread_id) if m.role == "user"]
    assert str(asked.content).startswith("Refund order 42.\n")
    assert "user: I want my money back" in str(asked.content)
    assert [e.type for e in events].count("run.completed") == 1


@pytest.mark.asyncio
async def test_a_failed_handoff_is_an_error_result_and_the_calling_agent_goes_on(
    env: Env,
) -> None:
    desk_model = Scripted.of(
        calls(("c1", "transfer_to_nobody", {"request": "Help."})),
        reply("I will help you myself."),
    )
    env.registry.add("desk", Agent("desk", desk_model, "Route.", [handoff("nobody")]))
    env.worker("w1")
    await submit(env.store, "chat", "desk", "help", dispatch_id="d1", wake=env.wake)
    done = await env.ended("chat")
    assert done.state["final"] == "I will help you myself."
    assert len(desk_model.requests) == 2
    tool = next(m for m in await env.store.messages("chat") if m.role == "tool")
    assert tool.metadata["outcome"] == "error"
    assert "does not exist" in str(tool.content)


@pytest.mark.asyncio
async def test_delegate_returns_to_the_calling_agents_model(env: Env) -> None:
    """The contrast: after a delegate the calling agent's model answers."""
    boss_model = Scripted.of(
        calls(("c1", "ask_billing", {"request": "Refund 42?"})), reply("Done: refunded.")
    )
    env.registry.add("desk", Agent("desk", boss_model, "Ask.", [delegate("billing")]))
    env.registry.add("billing", Agent("billing", Scripted.of(reply("Refunded.")), "Bill."))
    env.worker("w1")
    await submit(env.store, "chat", "desk", "refund", dispatch_id="d1", wake=env.wake)
    done = await env.ended("chat")
    assert done.state["final"] == "Done: refunded." and len(boss_model.requests) == 2
    assert "agent.handed_off" not in [e.type for e in await env.store.events_after("chat")]


def test_a_handoffs_transcript_keeps_the_request_and_the_latest_turns() -> None:
    history = [
        Message(id=f"m{i}", role="user" if i % 2 else "assistant", content=f"say {i}")
        for i in range(50)
    ] + [Message(id="t", role="tool", content="tool output", tool_call_id="c")]
    text = transcript(history, "Take over.", "desk").splitlines()
    assert text[:3] == ["Take over.", "", "Conversation so far (handed over by desk):"]
    assert len(text) == 3 + 40 and text[-1] == "user: say 49" and "tool output" not in text
    tool = handoff("billing.eu")
    assert tool.name == "transfer_to_billing_eu" and tool.handoff and tool.delegate == "billing.eu"
