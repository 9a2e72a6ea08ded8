"""A new model step streamed with checkpoints, and recovered from one.

The wrapped PydanticAI model streams the response; the partial text is saved as the run's
stream checkpoint (``store.stream_checkpoints``, the one wakeful's own agent writes) every
``checkpoint_every_deltas`` events or ``checkpoint_every_seconds``. A replacement process
re-executing the step finds it and follows wakeful's plans (docs/agents.md):

- **R1** text only: a continuation request (the request plus the partial text as an
  assistant turn and a prompt to continue; never recorded) whose text is appended;
- **R4** anything else (a tool call had started): the request is made again.

R2/R3 (keep complete tool calls) need the provider's tool-call deltas, which PydanticAI's
stream exposes only as parts in progress: they are taken as R4 in this version."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
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
        if saved.partial_text and saved.in_flight_tool is None and not saved.tool_calls:
            prefix = saved.partial_text
            recoveries.append("R1")
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
    async with model.request_stream(request, settings, params) as stream:
        async for event in stream:
            if relay is not None:
                relay(event)
            since += 1
            now = time.monotonic()
            due = since >= policy.checkpoint_every_deltas or (
                now - last >= policy.checkpoint_every_seconds
            )
            if store is not None and due and now - last >= policy.checkpoint_min_interval:
                await _save(ctx, store, model_name, prefix, stream.get())
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
    ctx: NodeContext, store: Any, model: str, prefix: str, partial: ModelResponse
) -> None:
    text = "".join(p.content for p in partial.parts if isinstance(p, TextPart))
    other = any(not isinstance(p, TextPart) for p in partial.parts)
    checkpoint = StreamCheckpoint(
        run_id=ctx.run_id,
        thread_id=ctx.thread_id,
        model=str(model),
        partial_text=prefix + text,
        in_flight_tool={"part": "non-text"} if other else None,
        token=ctx.fencing_token,
        task_id=ctx.task_id,
    )
    try:
        await store.put(checkpoint)
    except Exception:  # a checkpoint failure never fails the run
        ctx.emit_live("stream.checkpoint_failed", {"run_id": ctx.run_id})


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
