"""WakefulRunner runs Agents SDK agents (the SDK's own ScriptedModel, unchanged) as durable
wakeful runs: tools once, history on the thread, handoffs recorded on the thread."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import BaseModel

agents = pytest.importorskip("agents")

from agents import Agent as SDKAgent  # noqa: E402
from agents import ItemHelpers, function_tool  # noqa: E402
from agents.stream_events import (  # noqa: E402
    AgentUpdatedStreamEvent,
    RawResponsesStreamEvent,
    RunItemStreamEvent,
)
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses import ResponseTextDeltaEvent  # noqa: E402

from tests.postgres_support import Databases  # noqa: E402
from wakeful import Runtime, open_store  # noqa: E402
from wakeful.errors import InvalidInput  # noqa: E402
from wakeful.openai_agents import WakefulRunner  # noqa: E402

pytestmark = pytest.mark.asyncio
pytest_plugins = ["tests.postgres_fixtures"]


def _url(kind: str, tmp_path: Path) -> str:
    return "memory://" if kind == "memory" else f"sqlite:///{tmp_path / 'w.db'}"


@pytest.mark.parametrize("streamed", [True, False])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_tool_once_and_history_on_the_thread(
    kind: str, streamed: bool, tmp_path: Path
) -> None:
    ran: list[str] = []

    @function_tool
    def lookup(order: int) -> str:
        """Find an order."""
        ran.append(f"lookup {order}")
        return f"order {order} shipped"

    model = ScriptedModel(
        [
            [function_call("lookup", {"order": 42}, call_id="c1")],
            [assistant_message("Your order 42 shipped.")],
            [assistant_message("You asked about order 42.")],
        ]
    )
    agent = SDKAgent(name="support", instructions="Be brief.", model=model, tools=[lookup])
    async with open_store(_url(kind, tmp_path)) as store:
        runner = WakefulRunner(Runtime(store), streamed=streamed)
        first = await runner.run(agent, "Where is order 42?", thread_id="t1")
        assert (first.status, first.final_output) == ("completed", "Your order 42 shipped.")
        assert ran == ["lookup 42"]
        second = await runner.run(agent, "What did I ask?", thread_id="t1")
        assert second.final_output == "You asked about order 42."
        messages = await store.messages("t1")
    assert [m.role for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert messages[2].content == "order 42 shipped"
    # the second request carried the first exchange (tool call and output included)
    seen = model.calls[2].input
    assert {"role": "user", "content": "Where is order 42?"} in seen
    assert any(
        i.get("type") == "function_call_output" and i["output"] == "order 42 shipped" for i in seen
    )
    assert model.calls[0].system_instructions == "Be brief."
    assert model.remaining_steps == 0
    assert [c.streamed for c in model.calls] == [streamed] * 3


async def test_handoff_switches_agent_and_is_read_back_from_the_thread() -> None:
    billing_model = ScriptedModel(
        [[assistant_message("Billing here: refunded.")], [assistant_message("Still billing.")]]
    )
    billing = SDKAgent(name="billing", instructions="You do billing.", model=billing_model)
    triage_model = ScriptedModel([[function_call("transfer_to_billing", {}, call_id="h1")]])
    triage = SDKAgent(name="triage", model=triage_model, handoffs=[billing])
    async with open_store("memory://") as store:
        runner = WakefulRunner(Runtime(store))
        result = await runner.run(triage, "Refund me", thread_id="t2")
        assert result.final_output == "Billing here: refunded."
        assert result.last_agent is billing
        assert billing_model.calls[0].system_instructions == "You do billing."
        # a second run on the thread (from the same starting agent) stays with billing
        again = await runner.run(triage, "And?", thread_id="t2")
        assert again.final_output == "Still billing."
        assert len(triage_model.calls) == 1
        tool = [m for m in await store.messages("t2") if m.role == "tool"]
    assert tool[0].metadata["tool"] == "transfer_to_billing"


async def test_replay_policy_names_must_exist() -> None:
    agent = SDKAgent(name="a", model=ScriptedModel([]))
    async with open_store("memory://") as store:
        with pytest.raises(InvalidInput):
            WakefulRunner(Runtime(store), replay={"nope": "never"}).agent(agent)


async def test_run_streamed_yields_the_sdks_stream_events_and_the_final_output() -> None:
    model = ScriptedModel([[assistant_message("Hello there.")]])
    agent = SDKAgent(name="greeter", model=model)
    async with open_store("memory://") as store:
        result = WakefulRunner(Runtime(store)).run_streamed(agent, "hi", thread_id="t3")
        complete_at_start = result.is_complete
        events = [e async for e in result.stream_events()]
        assert [m.content for m in await store.messages("t3")] == ["hi", "Hello there."]
    assert isinstance(events[0], AgentUpdatedStreamEvent) and events[0].new_agent is agent
    deltas = [e.data for e in events if isinstance(e, RawResponsesStreamEvent)]
    texts = [d.delta for d in deltas if isinstance(d, ResponseTextDeltaEvent)]
    assert len(texts) == len(deltas) and "".join(texts) == "Hello there."
    items = [e for e in events if isinstance(e, RunItemStreamEvent)]
    assert [e.name for e in items] == ["message_output_created"]
    assert ItemHelpers.text_message_output(items[0].item) == "Hello there."  # type: ignore[arg-type]
    assert (complete_at_start, result.is_complete) == (False, True)
    assert result.final_output == "Hello there."
    assert result.last_agent is agent and len(result.new_items) == 1


async def test_the_example_hands_off_and_keeps_the_thread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples.openai_agents.__main__ import main

    await main(f"sqlite:///{tmp_path / 'ex.db'}")
    assert capsys.readouterr().out.splitlines() == [
        "billing -> Order 42 is refunded.",
        "billing -> Anything else about order 42?",
        "8 messages on the thread",
    ]


@pytest.mark.postgres
async def test_postgres_thread_keeps_tools_and_handoff(pg_databases: Databases) -> None:
    ran: list[int] = []

    @function_tool
    def charge(amount: int) -> str:
        """Charge."""
        ran.append(amount)
        return f"charged {amount}"

    billing = SDKAgent(
        name="billing",
        tools=[charge],
        model=ScriptedModel(
            [[function_call("charge", {"amount": 3}, call_id="c1")], [assistant_message("Done.")]]
        ),
    )
    triage_model = ScriptedModel([[function_call("transfer_to_billing", {}, call_id="h1")]])
    triage = SDKAgent(name="triage", model=triage_model, handoffs=[billing])
    async with open_store(await pg_databases.clone()) as store:
        result = await WakefulRunner(Runtime(store), replay={"charge": "never"}).run(
            triage, "Charge me 3", thread_id="pg-1"
        )
        messages = await store.messages("pg-1")
    assert (result.final_output, result.last_agent.name, ran) == ("Done.", "billing", [3])
    assert [m.role for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert messages[4].metadata["replay"] == "never"


async def test_a_fleet_worker_runs_the_sdk_agents_as_a_target() -> None:
    from tests.runtime_support import eventually
    from wakeful import ManualClock
    from wakeful.fleet import LocalWake, Registry, Worker, send_message
    from wakeful.runtime import ClaimPolicy
    from wakeful.store.memory import MemoryStore

    billing = SDKAgent(name="billing", model=ScriptedModel([[assistant_message("Refunded.")]]))
    triage_model = ScriptedModel([[function_call("transfer_to_billing", {}, call_id="h1")]])
    triage = SDKAgent(name="triage", model=triage_model, handoffs=[billing])
    clock = ManualClock()
    store = MemoryStore(clock)
    wake = LocalWake()
    registry = Registry(default="triage").add("triage", WakefulRunner(Runtime(store)).agent(triage))
    worker = Worker(
        store,
        registry,
        claims=ClaimPolicy(ttl=30, renew_every=10),
        wake=wake,
        worker_id="w1",
        poll_interval=0.05,
        clock=clock,
    )
    task = asyncio.create_task(worker.run())
    try:
        await send_message(store, "f1", "Refund me", target="triage", wake=wake)

        async def answered() -> bool:
            return [m.content for m in await store.messages("f1")][-1:] == ["Refunded."]

        await eventually(answered)
        snap = await store.read("f1")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.status == "completed"
    finally:
        await worker.stop(grace=5)
        await asyncio.wait_for(task, 10)


async def test_dynamic_instructions_and_output_type() -> None:
    class Weather(BaseModel):
        city: str
        celsius: int

    model = ScriptedModel([[assistant_message('{"city": "Paris", "celsius": 21}')]])
    agent = SDKAgent(
        name="meteo",
        instructions=lambda ctx, agent: f"You are {agent.name}.",
        model=model,
        output_type=Weather,
    )
    async with open_store("memory://") as store:
        result = await WakefulRunner(Runtime(store)).run(agent, "Paris?")
    assert result.final_output == Weather(city="Paris", celsius=21)
    assert model.calls[0].system_instructions == "You are meteo."
    assert model.calls[0].output_schema is not None
    assert result.thread_id.startswith("oai-")


async def test_an_agent_cannot_call_another_agents_tool() -> None:
    ran: list[str] = []

    @function_tool
    def secret() -> str:
        """Billing only."""
        ran.append("secret")
        return "leaked"

    billing = SDKAgent(name="billing", tools=[secret], model=ScriptedModel([]))
    triage_model = ScriptedModel(
        [[function_call("secret", {}, call_id="x1")], [assistant_message("Cannot.")]]
    )
    triage = SDKAgent(name="triage", model=triage_model, handoffs=[billing])
    async with open_store("memory://") as store:
        result = await WakefulRunner(Runtime(store)).run(triage, "peek", thread_id="t5")
        tool = next(m for m in await store.messages("t5") if m.role == "tool")
    assert (result.final_output, ran) == ("Cannot.", [])
    assert tool.metadata["outcome"] == "invalid" and "no tool named 'secret'" in tool.content
