"""``WakefulRunner.run_streamed``'s result: the Agents SDK's ``RunResultStreaming`` interface
over a durable run.

``stream_events()`` yields the SDK's own event types as the durable run goes: a
``RawResponsesStreamEvent`` (``ResponseTextDeltaEvent``) per live text delta of a model turn
as the provider sends it, an ``AgentUpdatedStreamEvent`` at the start and after each
handoff, and a ``RunItemStreamEvent`` per item once its step is committed
(``message_output_created``, ``tool_called``, ``tool_output``, ``handoff_requested``,
``handoff_occured``). ``final_output``, ``current_agent`` / ``last_agent``, ``new_items``
and ``is_complete`` are set as in the SDK; the stream checkpoints and commits as ``run``
does, so a run whose process dies is continued by ``recover``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from agents import Agent as SDKAgent
from agents.items import (
    HandoffCallItem,
    HandoffOutputItem,
    MessageOutputItem,
    RunItem,
    ToolCallItem,
    ToolCallOutputItem,
)
from agents.stream_events import (
    AgentUpdatedStreamEvent,
    RawResponsesStreamEvent,
    RunItemStreamEvent,
    StreamEvent,
)
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)

from wakeful.records import Event, Message
from wakeful.runtime.events import LiveEvent

if TYPE_CHECKING:
    from wakeful.openai_agents.runner import WakefulRunResult, _Team

_DONE = object()


class WakefulRunResultStreaming:
    """What ``WakefulRunner.run_streamed`` returns (the SDK's ``RunResultStreaming``
    interface): iterate ``stream_events()``; once it ends, ``final_output`` is the answer
    and ``is_complete`` is true. ``thread_id`` / ``run_id`` name the durable run."""

    def __init__(
        self,
        team: _Team,
        input: str,
        max_turns: int,
        events: Callable[[], AsyncIterator[Event | LiveEvent]],
        finish: Callable[[], Awaitable[WakefulRunResult]],
        thread_id: str,
        load: Callable[[int], Awaitable[Sequence[Message]]],
        streamed: bool = True,
    ) -> None:
        self.input = input
        self.new_items: list[RunItem] = []
        self.raw_responses: list[Any] = []
        self.final_output: Any = None
        self.current_agent: SDKAgent[Any] = team.start
        self.current_turn = 0
        self.max_turns = max_turns
        self.is_complete = False
        self.thread_id = thread_id
        self.run_id: str | None = None
        self._team = team
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._error: BaseException | None = None
        self._messages: list[Message] = []
        self._streamed = ""
        self.streamed = streamed
        """Whether model turns stream text deltas (the runner's ``streamed``)."""
        self._sequence = 0
        self._load = load
        self._task = asyncio.get_running_loop().create_task(self._run(events, finish))

    @property
    def last_agent(self) -> SDKAgent[Any]:
        return self.current_agent

    async def stream_events(self) -> AsyncIterator[StreamEvent]:
        """The run's events as they happen, until it ends (its error, if it failed)."""
        while True:
            item = await self._queue.get()
            if item is _DONE:
                break
            yield item
        if self._error is not None:
            raise self._error

    def cancel(self, mode: str = "immediate") -> None:
        """Stop streaming here. The durable run is not lost: ``recover`` continues it."""
        self._task.cancel()

    def final_output_as(self, cls: type[Any], raise_if_incorrect_type: bool = False) -> Any:
        if raise_if_incorrect_type and not isinstance(self.final_output, cls):
            raise TypeError(f"final output is not a {cls.__name__}")
        return self.final_output

    def to_input_list(self) -> list[Any]:
        """The input and the run's items as Responses input items (for a next run)."""
        items: list[Any] = [{"role": "user", "content": self.input}]
        for item in self.new_items:
            items.append(item.to_input_item())
        return items

    async def _run(
        self,
        events: Callable[[], AsyncIterator[Event | LiveEvent]],
        finish: Callable[[], Awaitable[WakefulRunResult]],
    ) -> None:
        try:
            # the thread before the run: whom it is with, what is not this run's
            self._messages = list(await self._load(0))
            self.current_agent = self._team.current(self._messages)
            self._queue.put_nowait(AgentUpdatedStreamEvent(new_agent=self.current_agent))
            in_turn = False
            async for item in events():
                if item.type == "text.delta" and isinstance(item.data, dict):
                    if not in_turn:  # a new model turn: the steps before it are committed
                        await self._items(before_turn=True)
                        in_turn = True
                    self._delta(str(item.data.get("text", "")))
                elif isinstance(item, Event):
                    await self._items()
                    in_turn = False
            await self._items(final=True)
            result = await finish()
            self.final_output = result.final_output
            self.current_agent = result.last_agent
            self.run_id = result.run_id
        except BaseException as exc:
            self._error = exc
            if isinstance(exc, asyncio.CancelledError):
                self._error = None
        finally:
            self.is_complete = True
            self._queue.put_nowait(_DONE)

    def _delta(self, text: str) -> None:
        self._streamed += text
        self._sequence += 1
        data = ResponseTextDeltaEvent(
            type="response.output_text.delta",
            content_index=0,
            delta=text,
            item_id="__wakeful__",
            logprobs=[],
            output_index=0,
            sequence_number=self._sequence,
        )
        self._queue.put_nowait(RawResponsesStreamEvent(data=data))

    async def _items(self, before_turn: bool = False, final: bool = False) -> None:
        """The thread's newly committed messages as the SDK's run items, in order.
        ``before_turn``: only those before the model turn now streaming. A streamed answer's
        message waits until its deltas were passed on (live and durable events need not
        arrive in commit order), or the run's end (``final``)."""
        new = await self._load(len(self._messages))
        for m in new:
            if m.role == "assistant":
                if before_turn:
                    return
                behind = self.streamed and len(self._streamed) < len(str(m.content or ""))
                if behind and not final:
                    return
                self._streamed = ""
            self._messages.append(m)
            for event in self._convert(self._messages, len(self._messages) - 1):
                self._queue.put_nowait(event)

    def _convert(self, messages: Sequence[Message], i: int) -> list[StreamEvent]:
        m = messages[i]
        agent = self._team.current(messages[:i])
        out: list[StreamEvent] = []

        def add(name: Any, item: RunItem) -> None:
            self.new_items.append(item)
            out.append(RunItemStreamEvent(name=name, item=item))

        if m.role == "assistant":
            self.current_turn += 1
            if m.content:
                text = ResponseOutputText(type="output_text", text=str(m.content), annotations=[])
                raw = ResponseOutputMessage(
                    id=m.id, type="message", role="assistant", status="completed", content=[text]
                )
                add("message_output_created", MessageOutputItem(agent=agent, raw_item=raw))
            for call in m.tool_calls or ():
                name = str(call.get("name"))
                fn = ResponseFunctionToolCall(
                    type="function_call",
                    call_id=str(call.get("id")),
                    name=name,
                    arguments=str(call.get("arguments") or "{}"),
                )
                if name in self._team.handoff_targets:
                    add("handoff_requested", HandoffCallItem(agent=agent, raw_item=fn))
                else:
                    add("tool_called", ToolCallItem(agent=agent, raw_item=fn))
        elif m.role == "tool":
            name = str((m.metadata or {}).get("tool"))
            raw_out: Any = {
                "type": "function_call_output",
                "call_id": str(m.tool_call_id),
                "output": str(m.content),
            }
            target = self._team.handoff_targets.get(name)
            if target is not None and (m.metadata or {}).get("outcome") == "ok":
                new = self._team.agents[target]
                item = HandoffOutputItem(
                    agent=agent, raw_item=raw_out, source_agent=agent, target_agent=new
                )
                add("handoff_occured", item)
                self.current_agent = new
                out.append(AgentUpdatedStreamEvent(new_agent=new))
            else:
                output = ToolCallOutputItem(agent=agent, raw_item=raw_out, output=m.content)
                add("tool_output", output)
        return out

    async def aclose(self) -> None:
        """Stop the stream's task (the durable run goes on in this process)."""
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
