"""``wakeful.openai_agents.Runner``: the SDK's ``Runner`` classmethods, durable. Its
signatures carry every SDK parameter (same names, same kinds), unsupported ones are refused,
and ``run`` / ``run_sync`` / ``run_streamed`` keep the conversation on the thread."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent as SDKAgent  # noqa: E402
from agents import Runner as SDKRunner  # noqa: E402
from agents import function_tool  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from wakeful import Runtime  # noqa: E402
from wakeful.errors import InvalidInput  # noqa: E402
from wakeful.openai_agents import Runner  # noqa: E402
from wakeful.store.memory import MemoryStore  # noqa: E402


@pytest.mark.parametrize("method", ["run", "run_sync", "run_streamed"])
def test_the_sdks_parameters_are_all_there(method: str) -> None:
    sdk = inspect.signature(getattr(SDKRunner, method)).parameters
    ours = inspect.signature(getattr(Runner, "run" if method == "run_sync" else method))
    for name, param in sdk.items():
        assert name in ours.parameters, name
        assert ours.parameters[name].kind == param.kind, name
    assert {"runtime", "thread_id"} <= set(ours.parameters)


def scripted(ran: list[int]) -> SDKAgent[None]:
    @function_tool
    def lookup(order: int) -> str:
        """Look an order up."""
        ran.append(order)
        return f"order {order}: shipped"

    model = ScriptedModel(
        [
            [function_call("lookup", {"order": 7}, call_id="c1")],
            [assistant_message("Order 7 shipped.")],
            [assistant_message("You asked about order 7.")],
        ]
    )
    return SDKAgent(name="desk", model=model, tools=[lookup])


@pytest.mark.asyncio
async def test_run_is_durable_on_the_thread_and_a_second_run_sees_the_first() -> None:
    ran: list[int] = []
    agent = scripted(ran)
    store = MemoryStore()
    runtime = Runtime(store)
    first = await Runner.run(agent, "where is order 7?", runtime=runtime, thread_id="t")
    assert first.final_output == "Order 7 shipped." and ran == [7]
    second = await Runner.run(agent, "what did I ask?", runtime=runtime, thread_id="t")
    assert second.final_output == "You asked about order 7."
    roles = [m.role for m in await store.messages("t", 0, 100)]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert isinstance(agent.model, ScriptedModel)
    assert len(agent.model.calls) == 3, "each model turn asked once"


def test_run_sync_runs_on_its_own_loop() -> None:
    ran: list[int] = []
    store = MemoryStore()
    result = Runner.run_sync(scripted(ran), "order 7?", runtime=Runtime(store), thread_id="t")
    assert result.final_output == "Order 7 shipped." and ran == [7]


@pytest.mark.asyncio
async def test_run_streamed_has_the_sdks_stream_interface() -> None:
    ran: list[int] = []
    result = Runner.run_streamed(scripted(ran), "order 7?", runtime=Runtime(MemoryStore()))
    names = [getattr(e, "name", e.type) async for e in result.stream_events()]
    assert names == [
        "agent_updated_stream_event",
        "tool_called",
        "tool_output",
        *["raw_response_event"] * names.count("raw_response_event"),
        "message_output_created",
    ]
    assert result.final_output == "Order 7 shipped." and ran == [7]
    items = result.to_input_list()
    assert items[0] == {"role": "user", "content": "order 7?"}
    assert len(items) == 1 + len(result.new_items) == 4


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("keyword", "value"),
    [("session", object()), ("hooks", object()), ("conversation_id", "c"), ("context", {})],
)
async def test_sdk_arguments_wakeful_does_not_carry_are_refused(keyword: str, value: Any) -> None:
    agent = SDKAgent(name="a", model=ScriptedModel([]))
    arguments: dict[str, Any] = {keyword: value}
    with pytest.raises(InvalidInput, match=keyword):
        await Runner.run(agent, "hi", runtime=Runtime(MemoryStore()), **arguments)
    with pytest.raises(InvalidInput, match="runtime"):
        await Runner.run(agent, "hi")
