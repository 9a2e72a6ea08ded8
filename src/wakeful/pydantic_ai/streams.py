"""A new model step streamed with checkpoints, and recovered from one.

The wrapped PydanticAI model streams the response; the partial text is saved as the run's
stream checkpoint (``store.stream_checkpoints``, the one wakeful's own agent writes) every
``checkpoint_every_deltas`` events or ``checkpoint_every_seconds``. A replacement process
re-executing the step finds it and follows wakeful's plans (docs/agents.md):

- **R1** text only: a continuation request (the request plus the partial text as an
  assistant turn and a prompt to continue; never recorded) whose text is appended;
- **R2** at least one complete tool call: the text and the complete calls are the response
  (no request); an unfinished call is dropped;
- **R3** text and an unfinished tool call: the call is dropped, the text continued as R1;
- **R4** nothing usable: the request is made again.

A tool call is complete once PydanticAI's stream ends its part (``PartEndEvent``: the next
part started, or the stream ended); a checkpoint is saved at once when one completes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    PartEndEvent,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings

from wakeful.agent.recovery import StreamPolicy
from wakeful.records import StreamCheckpoint
from wakeful.runtime import NodeContext


async def streamed_step(
    ctx: NodeContext,
    model: Model,
    messages: list[ModelMessage],
    settings: ModelSettings | None,
    params: ModelRequestParameters,
    policy: StreamPolicy,
    relay: Callable[[Any], None] | None = None,
) -> tuple[ModelResponse, list[str]]:
    """The response of one new model step and how it was obtained (``resumed``, ``R1``,
    ``R4``), saving checkpoints as it streams. ``relay`` gets each provider event as it
    arrives (``run_stream``'s live deltas); not for a continued answer (R1), whose text
    before the cut it never saw: that response reaches the mirror whole."""
    store: Any = getattr(ctx.store, "stream_checkpoints", None)
    saved = await _saved(ctx, store)
    prefix, recoveries, request = "", [], messages
    if saved is not None:
        recoveries.append("resumed")
        if saved.tool_calls:
            recoveries.append("R2")
            if store is not None:
                ctx.on_committed(lambda: _discard(ctx, store))
            return _complete_calls(saved, model), recoveries
        if saved.partial_text:
            prefix = saved.partial_text
            recoveries.append("R3" if saved.in_flight_tool is not None else "R1")
            relay = None
            request = [
                *messages,
                ModelResponse(parts=[TextPart(prefix)]),
                ModelRequest(parts=[UserPromptPart(policy.continuation_prompt)]),
            ]
        else:
            recoveries.append("R4")
    model_name = getattr(model, "model_name", type(model).__name__)
    since, last = 0, time.monotonic()
    complete: set[int] = set()
    async with model.request_stream(request, settings, params) as stream:
        async for event in stream:
            if relay is not None:
                relay(event)
            since += 1
            now = time.monotonic()
            due = since >= policy.checkpoint_every_deltas or (
                now - last >= policy.checkpoint_every_seconds
            )
            ended = False
            if isinstance(event, PartEndEvent) and isinstance(event.part, ToolCallPart):
                complete.add(event.index)
                ended = True
            throttled = now - last < policy.checkpoint_min_interval
            if store is not None and (ended or (due and not throttled)):
                await _save(ctx, store, model_name, prefix, stream.get(), complete)
                since, last = 0, now
        response = stream.get()
    if prefix:
        response = _prefixed(response, prefix)
    if store is not None:
        ctx.on_committed(lambda: _discard(ctx, store))
    return response, recoveries


async def _saved(ctx: NodeContext, store: Any) -> StreamCheckpoint | None:
    if store is None or ctx.fresh:
        return None
    try:
        saved: StreamCheckpoint | None = await store.get(ctx.run_id)
    except Exception:  # best effort: the thread commit stays the authority
        return None
    if saved is None or saved.task_id != ctx.task_id:
        return None
    return saved


async def _save(
    ctx: NodeContext,
    store: Any,
    model: str,
    prefix: str,
    partial: ModelResponse,
    complete: set[int],
) -> None:
    text = "".join(p.content for p in partial.parts if isinstance(p, TextPart))
    calls: list[dict[str, Any]] = []
    in_flight: dict[str, Any] | None = None
    for i, part in enumerate(partial.parts):
        if isinstance(part, ToolCallPart):
            call = {
                "id": part.tool_call_id,
                "name": part.tool_name,
                "arguments": part.args_as_json_str(),
            }
            if i in complete:
                calls.append(call)
            else:
                in_flight = call
        elif not isinstance(part, TextPart):
            in_flight = in_flight or {"part": part.part_kind}
    checkpoint = StreamCheckpoint(
        run_id=ctx.run_id,
        thread_id=ctx.thread_id,
        model=str(model),
        partial_text=prefix + text,
        tool_calls=calls,
        in_flight_tool=in_flight,
        token=ctx.fencing_token,
        task_id=ctx.task_id,
    )
    try:
        await store.put(checkpoint)
    except Exception:  # a checkpoint failure never fails the run
        ctx.emit_live("stream.checkpoint_failed", {"run_id": ctx.run_id})


def _complete_calls(saved: StreamCheckpoint, model: Any) -> ModelResponse:
    """R2: the checkpointed text and complete tool calls as the step's response."""
    parts: list[Any] = [TextPart(saved.partial_text)] if saved.partial_text else []
    for call in saved.tool_calls:
        parts.append(
            ToolCallPart(str(call["name"]), str(call["arguments"]), tool_call_id=str(call["id"]))
        )
    return ModelResponse(parts=parts, model_name=getattr(model, "model_name", None))


async def _discard(ctx: NodeContext, store: Any) -> None:
    try:
        discard = getattr(store, "discard", None)
        if discard is not None:
            await discard(ctx.run_id, ctx.task_id, ctx.fencing_token)
    except Exception:
        ctx.emit_live("stream.checkpoint_failed", {"run_id": ctx.run_id})


def _prefixed(response: ModelResponse, prefix: str) -> ModelResponse:
    """The continued response with the checkpointed text before its own."""
    parts = list(response.parts)
    for i, part in enumerate(parts):
        if isinstance(part, TextPart):
            parts[i] = TextPart(prefix + part.content)
            break
    else:
        parts.insert(0, TextPart(prefix))
    response.parts = parts
    return response
