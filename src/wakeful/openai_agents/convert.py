"""Translation between wakeful's thread messages and the Agents SDK's Responses items, and
an SDK ``Model`` seen as a wakeful ``Provider``.

The SDK model is called with ``get_response`` (one whole response); its output items become
one streamed turn (text, then tool calls, then the end marker), so wakeful's stream recovery
treats it as a request that either answered or did not (plan R4 / retry before output)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from agents import Agent as SDKAgent
from agents import Handoff, Model, ModelSettings
from agents.models.interface import ModelTracing
from agents.models.multi_provider import MultiProvider
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from wakeful.providers.base import (
    ModelRequest,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from wakeful.records import Message


def input_items(messages: Sequence[Message]) -> list[Any]:
    """The thread's messages as Responses input items (user/assistant text, function calls
    and their outputs)."""
    items: list[Any] = []
    for m in messages:
        if m.role == "user":
            items.append({"role": "user", "content": m.content})
        elif m.role == "assistant":
            if m.content:
                items.append({"role": "assistant", "content": m.content})
            for call in m.tool_calls or ():
                items.append(
                    {
                        "type": "function_call",
                        "call_id": str(call.get("id")),
                        "name": str(call.get("name")),
                        "arguments": str(call.get("arguments") or "{}"),
                    }
                )
        elif m.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": str(m.tool_call_id),
                    "output": m.content,
                }
            )
    return items


def resolve_model(agent: SDKAgent[Any]) -> Model:
    """The agent's ``Model``: itself, or the one its name designates (the SDK's default
    provider), or the SDK's default model."""
    if isinstance(agent.model, Model):
        return agent.model
    return MultiProvider().get_model(agent.model)


class SDKModelProvider:
    """A wakeful ``Provider`` whose turns come from the Agents SDK agent that is current on
    the thread. ``current(messages)`` names that agent (handoffs change it); ``handoffs``
    gives the agent's ``Handoff`` objects, which the model sees as tools."""

    def __init__(
        self,
        current: Callable[[Sequence[Message]], SDKAgent[Any]],
        handoffs: Callable[[SDKAgent[Any]], list[Handoff[Any, Any]]],
        tools: Callable[[SDKAgent[Any]], list[Any]],
    ) -> None:
        self._current = current
        self._handoffs = handoffs
        self._tools = tools
        self.model = "openai-agents"
        self.requests = 0
        """How many model requests this process made."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        agent = self._current(request.messages)
        model = resolve_model(agent)
        instructions = agent.instructions if isinstance(agent.instructions, str) else None
        self.requests += 1
        response = await model.get_response(
            instructions,
            input_items(request.messages),
            agent.model_settings or ModelSettings(),
            self._tools(agent),
            None,
            self._handoffs(agent),
            ModelTracing.DISABLED,
            previous_response_id=None,
            conversation_id=None,
            prompt=None,
        )
        index = 0
        calls = False
        for item in response.output:
            if isinstance(item, ResponseOutputMessage):
                for part in item.content:
                    if isinstance(part, ResponseOutputText) and part.text:
                        yield TextDelta(part.text)
            elif isinstance(item, ResponseFunctionToolCall):
                calls = True
                yield ToolCallDelta(
                    index, id=item.call_id, name=item.name, arguments=item.arguments or "{}"
                )
                index += 1
        usage = response.usage
        yield StreamEnd(
            "tool_use" if calls else "end_turn",
            Usage(int(usage.input_tokens or 0), int(usage.output_tokens or 0)),
        )
