"""Live streaming of a durable PydanticAI run: ``WakefulAgent.run_stream`` and ``iter``.

The durable run goes on as ever (a wakeful run whose supersteps each take one step, the
model steps streamed with checkpoints). Alongside it, in the caller's task, PydanticAI's own
``run_stream`` / ``iter`` runs over a *mirror*: a model whose request ``i`` relays the
durable run's model step ``i`` event by event as the provider sends it, and a toolset whose
calls wait for the durable run's recorded result of the same call. So the caller gets
PydanticAI's own ``StreamedRunResult`` / ``AgentRun`` with live deltas, nothing runs twice,
and the checkpoints keep being written by the durable run.

The channel between them (``LiveRun``) is in-process: the durable run publishes its model
events, its recorded responses and its tool results; the mirror waits for them."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPartDelta,
    ThinkingPartDelta,
    ToolCallPartDelta,
)
from pydantic_ai.models import ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from wakeful.errors import InvalidInput
from wakeful.pydantic_ai.codec import replay_result


class LiveRun:
    """What the durable run did so far, for its mirror: the provider events of each model
    step (by response index), each recorded response, each recorded tool result, and how
    the run ended (``close``)."""

    def __init__(self) -> None:
        self.events: dict[int, list[ModelResponseStreamEvent]] = {}
        self.responses: dict[int, ModelResponse] = {}
        self.tools: dict[str, dict[str, Any]] = {}
        self.ended = False
        self.error: BaseException | None = None
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def event(self, index: int, event: ModelResponseStreamEvent) -> None:
        self.events.setdefault(index, []).append(event)
        self._notify()

    def restart(self, index: int) -> None:
        """The step's request is made again (its earlier events are void)."""
        self.events[index] = []
        self._notify()

    def response(self, index: int, response: ModelResponse) -> None:
        self.responses[index] = response
        self._notify()

    def tool(self, call_id: str, result: dict[str, Any]) -> None:
        self.tools[call_id] = dict(result)
        self._notify()

    def close(self, error: BaseException | None = None) -> None:
        self.ended, self.error = True, error
        self._notify()

    async def changed(self) -> None:
        """Wait for the next publication; raise if the run ended without it."""
        if self.ended:
            if self.error is not None:
                raise self.error
            raise InvalidInput("run", "the durable run ended before the step its stream waits for")
        await self._changed.wait()


@dataclass
class RelayStream(StreamedResponse):
    """The durable run's model step ``index`` as a PydanticAI stream: its provider events
    re-applied through this stream's parts manager as they arrive; it ends once the
    response is recorded (committed with its superstep), and ``get()`` is then the
    recorded response."""

    live: LiveRun = field(default_factory=LiveRun)
    index: int = 0
    _recorded: ModelResponse | None = field(default=None, init=False)

    async def close_stream(self) -> None:
        """Nothing to close here: the durable run owns the provider's stream."""

    async def _get_event_iterator(self) -> AsyncIterator[ModelResponseStreamEvent]:
        seen, current = 0, None
        while True:
            events = self.live.events.setdefault(self.index, [])
            if events is not current:  # the request was made (again): from its start
                seen, current = 0, events
            while seen < len(events):
                event = events[seen]
                seen += 1
                for out in _apply(self, event):
                    yield out
            recorded = self.live.responses.get(self.index)
            if recorded is not None and seen == len(events):
                break
            await self.live.changed()
        self._recorded = recorded
        if not seen:  # requested whole (no stream): its parts, one event each
            for i, part in enumerate(recorded.parts):
                yield self._parts_manager.handle_part(vendor_part_id=("r", i), part=part)
        self._usage = recorded.usage
        self.provider_response_id = recorded.provider_response_id
        self.finish_reason = recorded.finish_reason

    def get(self) -> ModelResponse:
        if self._recorded is not None:
            return self._recorded
        return super().get()

    @property
    def model_name(self) -> str:
        recorded = self.live.responses.get(self.index)
        return (recorded.model_name if recorded is not None else None) or "wakeful-relay"

    @property
    def provider_name(self) -> str | None:
        recorded = self.live.responses.get(self.index)
        return recorded.provider_name if recorded is not None else None

    @property
    def provider_url(self) -> str | None:
        return None

    @property
    def timestamp(self) -> datetime:
        recorded = self.live.responses.get(self.index)
        return recorded.timestamp if recorded is not None else datetime.now().astimezone()


def _apply(stream: RelayStream, event: ModelResponseStreamEvent) -> Iterator[Any]:
    """A provider event of the durable step through the relay's own parts manager (its
    part-end and final-result events are the relay's own to make)."""
    parts = stream._parts_manager
    if isinstance(event, PartStartEvent):
        yield parts.handle_part(vendor_part_id=event.index, part=dataclasses.replace(event.part))
    elif isinstance(event, PartDeltaEvent):
        delta = event.delta
        if isinstance(delta, TextPartDelta):
            yield from parts.handle_text_delta(
                vendor_part_id=event.index, content=delta.content_delta
            )
        elif isinstance(delta, ToolCallPartDelta):
            out = parts.handle_tool_call_delta(
                vendor_part_id=event.index,
                tool_name=delta.tool_name_delta,
                args=delta.args_delta,
                tool_call_id=delta.tool_call_id,
            )
            if out is not None:
                yield out
        elif isinstance(delta, ThinkingPartDelta):
            yield from parts.handle_thinking_delta(
                vendor_part_id=event.index,
                content=delta.content_delta,
                signature=delta.signature_delta,
            )


class MirrorModel(WrapperModel):
    """The model of the mirror run: request ``i`` is the durable run's model step ``i``."""

    def __init__(self, wrapped: Any, live: LiveRun) -> None:
        super().__init__(wrapped)
        self.live = live
        self.next_index = 0

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        index, self.next_index = self.next_index, self.next_index + 1
        while index not in self.live.responses:
            await self.live.changed()
        return self.live.responses[index]

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        index, self.next_index = self.next_index, self.next_index + 1
        yield RelayStream(model_request_parameters, live=self.live, index=index)


@dataclass
class MirrorToolset(WrapperToolset[Any]):
    """A toolset of the mirror run: a call returns the durable run's recorded result."""

    live: LiveRun = field(default_factory=LiveRun)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        call_id = ctx.tool_call_id or f"{name}-{ctx.run_step}"
        while call_id not in self.live.tools:
            await self.live.changed()
        return replay_result(self.live.tools[call_id])


def mirror_toolset(toolset: AbstractToolset[Any], live: LiveRun) -> AbstractToolset[Any]:
    return toolset.visit_and_replace(lambda leaf: MirrorToolset(leaf, live=live))
