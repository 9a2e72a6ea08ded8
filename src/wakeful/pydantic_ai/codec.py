"""PydanticAI messages <-> wakeful thread messages.

Each model response is an ``assistant`` message (text in ``content``, tool calls in
``tool_calls`` as ``{"id", "name", "arguments"}``) with the exact PydanticAI response, as
PydanticAI's own JSON, in ``metadata["pydantic_ai"]``; each tool result is a ``tool``
message with the recorded outcome in ``metadata["result"]``. So a console, the HTTP API and
``wakeful threads messages`` show the conversation, and the next run on the thread gets it
back as PydanticAI ``message_history``."""

from __future__ import annotations

from typing import Any

import pydantic_core
from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from wakeful.errors import InvalidInput
from wakeful.records import Message


def dump_response(response: ModelResponse) -> Any:
    return pydantic_core.to_jsonable_python(ModelMessagesTypeAdapter.dump_python([response]))


def load_response(data: Any) -> ModelResponse:
    loaded = ModelMessagesTypeAdapter.validate_python(data)
    if len(loaded) != 1 or not isinstance(loaded[0], ModelResponse):
        raise InvalidInput("message", "a recorded PydanticAI response is not one response")
    return loaded[0]


def response_message(message_id: str, run_id: str, response: ModelResponse) -> Message:
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    calls = [
        {"id": p.tool_call_id, "name": p.tool_name, "arguments": p.args_as_json_str()}
        for p in response.parts
        if isinstance(p, ToolCallPart)
    ]
    usage = pydantic_core.to_jsonable_python(response.usage)
    return Message(
        id=message_id,
        role="assistant",
        content=text,
        tool_calls=calls,
        run_id=run_id,
        metadata={"pydantic_ai": dump_response(response), "usage": usage},
    )


def tool_message(
    message_id: str,
    run_id: str,
    call_id: str,
    name: str,
    replay: str,
    result: dict[str, Any],
) -> Message:
    outcome = str(result.get("outcome"))
    stored = {
        "outcome": outcome,
        "value": pydantic_core.to_jsonable_python(result.get("value")),
        **({"message": result["message"]} if "message" in result else {}),
    }
    value = stored["value"]
    shown = (
        result.get("message")
        if outcome == "retry"
        else value
        if isinstance(value, str)
        else pydantic_core.to_json(value).decode()
    )
    return Message(
        id=message_id,
        role="tool",
        content=shown,
        tool_call_id=call_id,
        run_id=run_id,
        metadata={"tool": name, "outcome": outcome, "replay": replay, "result": stored},
    )


def message_history(messages: list[Message], run_id: str) -> list[ModelMessage]:
    """The thread's conversation before run ``run_id`` as PydanticAI messages."""
    out: list[ModelMessage] = []
    names: dict[str, str] = {}
    for message in messages:
        if message.run_id == run_id:
            continue
        meta = message.metadata or {}
        if message.role == "user":
            out.append(ModelRequest(parts=[UserPromptPart(content=str(message.content or ""))]))
        elif message.role == "assistant" and "pydantic_ai" in meta:
            response = load_response(meta["pydantic_ai"])
            for call in response.parts:
                if isinstance(call, ToolCallPart):
                    names[call.tool_call_id] = call.tool_name
            out.append(response)
        elif message.role == "tool" and message.tool_call_id:
            result = meta.get("result") or {}
            name = str(meta.get("tool") or names.get(message.tool_call_id, ""))
            back: ToolReturnPart | RetryPromptPart
            if result.get("outcome") == "retry":
                back = RetryPromptPart(
                    content=str(result.get("message")),
                    tool_name=name,
                    tool_call_id=message.tool_call_id,
                )
            else:
                back = ToolReturnPart(
                    tool_name=name,
                    content=result.get("value", message.content),
                    tool_call_id=message.tool_call_id,
                )
            last = out[-1] if out else None
            if isinstance(last, ModelRequest) and all(
                isinstance(p, ToolReturnPart | RetryPromptPart) for p in last.parts
            ):
                last.parts = [*last.parts, back]
            else:
                out.append(ModelRequest(parts=[back]))
    return out


def replay_result(recorded: dict[str, Any]) -> Any:
    """A recorded tool outcome as the tool call returns it again: its value, or the
    ``ModelRetry`` it raised."""
    if recorded.get("outcome") == "retry":
        raise ModelRetry(str(recorded.get("message")))
    return recorded.get("value")
