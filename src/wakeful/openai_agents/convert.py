"""Translation between wakeful's thread messages and the Agents SDK's Responses items, and
an SDK ``Model`` seen as a wakeful ``Provider``.

The SDK model is called with ``stream_response``: its text deltas and finished function
calls become one wakeful stream turn, so wakeful's stream recovery checkpoints it and, after
a crash, continues an interrupted answer (R1) or retries a request that gave nothing. With
``streamed=False`` it is called with ``get_response`` (one whole response, no checkpoints).
OpenAI client errors become ``ProviderError`` of the matching kind (retryable or not)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import openai
from agents import Agent as SDKAgent
from agents import (
    AgentOutputSchema,
    AgentOutputSchemaBase,
    Handoff,
    Model,
    ModelSettings,
    RunContextWrapper,
)
from agents.models.interface import ModelTracing
from agents.models.multi_provider import MultiProvider
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)

from wakeful.providers.base import (
    ErrorKind,
    ModelRequest,
    ProviderError,
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


def output_schema(agent: SDKAgent[Any]) -> AgentOutputSchemaBase | None:
    """The agent's structured output schema, or ``None`` for plain text."""
    if agent.output_type is None or agent.output_type is str:
        return None
    if isinstance(agent.output_type, AgentOutputSchemaBase):
        return agent.output_type
    return AgentOutputSchema(agent.output_type)


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
        *,
        streamed: bool = True,
    ) -> None:
        self.streamed = streamed
        """Use the model's ``stream_response`` (deltas are checkpointed, an interrupted
        answer is continued) rather than ``get_response``."""
        self._current = current
        self._handoffs = handoffs
        self._tools = tools
        self.model = "openai-agents"
        self.requests = 0
        """How many model requests this process made."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        agent = self._current(request.messages)
        model = resolve_model(agent)
        # dynamic instructions are called as the SDK calls them (no run context object)
        instructions = await agent.get_system_prompt(RunContextWrapper(context=None))
        self.requests += 1
        args: tuple[Any, ...] = (
            instructions,
            input_items(request.messages),
            agent.model_settings or ModelSettings(),
            self._tools(agent),
            output_schema(agent),
            self._handoffs(agent),
            ModelTracing.DISABLED,
        )
        kwargs: dict[str, Any] = {
            "previous_response_id": None,
            "conversation_id": None,
            "prompt": None,
        }
        try:
            if not self.streamed:
                response = await model.get_response(*args, **kwargs)
                for whole in _response_items(response.output, response.usage):
                    yield whole
                return
            index = 0
            async for event in model.stream_response(*args, **kwargs):
                if isinstance(event, ResponseTextDeltaEvent):
                    if event.delta:
                        yield TextDelta(event.delta)
                elif isinstance(event, ResponseOutputItemDoneEvent):
                    item = event.item
                    if isinstance(item, ResponseFunctionToolCall):
                        yield ToolCallDelta(
                            index, id=item.call_id, name=item.name, arguments=item.arguments or "{}"
                        )
                        index += 1
                elif isinstance(event, ResponseCompletedEvent):
                    usage = event.response.usage
                    yield StreamEnd(
                        "tool_use" if index else "end_turn",
                        Usage(usage.input_tokens, usage.output_tokens) if usage else None,
                    )
                    return
        except openai.APIStatusError as exc:
            raise ProviderError(_kind(exc.status_code), str(exc), status=exc.status_code) from exc
        except openai.APITimeoutError as exc:
            raise ProviderError("timeout", str(exc)) from exc
        except openai.APIConnectionError as exc:
            raise ProviderError("connection", str(exc)) from exc


def _kind(status: int) -> ErrorKind:
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status in (400, 422):
        return "invalid_request"
    return "overloaded" if status == 529 else "server"


def _response_items(output: Sequence[Any], usage: Any) -> list[StreamItem]:
    """A whole (non-streamed) response as one turn: text, tool calls, end marker."""
    items: list[StreamItem] = []
    index = 0
    for item in output:
        if isinstance(item, ResponseOutputMessage):
            for part in item.content:
                if isinstance(part, ResponseOutputText) and part.text:
                    items.append(TextDelta(part.text))
        elif isinstance(item, ResponseFunctionToolCall):
            items.append(
                ToolCallDelta(
                    index, id=item.call_id, name=item.name, arguments=item.arguments or "{}"
                )
            )
            index += 1
    items.append(
        StreamEnd(
            "tool_use" if index else "end_turn",
            Usage(int(usage.input_tokens or 0), int(usage.output_tokens or 0)),
        )
    )
    return items
