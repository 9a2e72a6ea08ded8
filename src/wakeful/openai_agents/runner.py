"""``WakefulRunner``: an OpenAI Agents SDK agent (and the agents it hands off to) run as a
wakeful agent graph on a thread.

- The run holds a fenced claim on the thread; each model request is a durable model step
  (wakeful's ``StreamRecovery``: a committed response is reused, an unanswered one is
  retried, never paid for twice once committed).
- Each function tool is a wakeful tool task with a replay policy (``safe`` by default,
  ``keyed`` or ``never`` per tool name): a ``never`` tool whose start was recorded is not run
  again on recovery, its result is ``Indeterminate``.
- A handoff is a tool call too: its result names the new agent, and the current agent is
  read back from the thread's messages, so it survives a crash between steps.
- The conversation is the thread's messages: a second run on the same ``thread_id`` sees
  the first exchange (and goes on with the agent the first one ended with)."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from agents import Agent as SDKAgent
from agents import FunctionTool, Handoff, RunContextWrapper, handoff
from agents.tool_context import ToolContext as SDKToolContext

from wakeful.agent import Agent
from wakeful.agent.agent import TERMINAL_EVENTS
from wakeful.agent.recovery import StreamPolicy
from wakeful.agent.tools import REPLAYS, ArgumentsInvalid, Tool, ToolContext
from wakeful.errors import InvalidInput
from wakeful.openai_agents.convert import SDKModelProvider, output_schema
from wakeful.openai_agents.streaming import WakefulRunResultStreaming
from wakeful.providers.base import ToolSpec
from wakeful.records import Event, Message
from wakeful.runtime import NodeContext, RunHandle, Runtime
from wakeful.runtime.events import LiveEvent
from wakeful.runtime.results import RunOutcome


class _Raw(msgspec.Struct):
    """Placeholder arguments type: SDK tools validate their own JSON."""


@dataclass(frozen=True)
class _SDKTool(Tool):
    """An SDK ``FunctionTool`` (or a ``Handoff``) as a wakeful tool: the model's JSON text is
    handed to the SDK unchanged."""

    sdk: Any = None
    schema: Any = None

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.schema)

    def parse(self, raw: str) -> dict[str, Any]:
        try:
            value = msgspec.json.decode(raw or "{}")
        except msgspec.DecodeError as exc:
            raise ArgumentsInvalid(f"arguments are not complete JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ArgumentsInvalid("arguments must be a JSON object")
        return {"raw": raw or "{}"}

    async def call(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        raw = str(arguments["raw"])
        if isinstance(self.sdk, Handoff):
            agent = await self.sdk.on_invoke_handoff(RunContextWrapper(context=None), raw)
            return msgspec.json.encode({"assistant": agent.name}).decode()
        tool_ctx = SDKToolContext(
            context=None, tool_name=self.name, tool_call_id=ctx.call_id, tool_arguments=raw
        )
        return await self.sdk.on_invoke_tool(tool_ctx, raw)


@dataclass(frozen=True)
class WakefulRunResult:
    """What ``WakefulRunner.run`` returns: ``final_output`` (the last agent's answer, text),
    ``last_agent`` (the agent that answered). With an ``output_type`` on that agent,
    ``final_output`` is the answer validated into it (``ModelBehaviorError`` if it does not)."""

    thread_id: str
    run_id: str
    status: str
    final_output: Any
    last_agent: SDKAgent[Any]


def _handoffs(agent: SDKAgent[Any]) -> list[Handoff[Any, Any]]:
    return [h if isinstance(h, Handoff) else handoff(h) for h in agent.handoffs]


def _target(h: Handoff[Any, Any]) -> SDKAgent[Any]:
    ref = getattr(h, "_agent_ref", None)
    agent = ref() if ref is not None else None
    if not isinstance(agent, SDKAgent):
        raise InvalidInput("handoffs", f"handoff {h.tool_name!r}: its agent is not known")
    return agent


class _Team:
    """The starting agent and every agent reachable by handoffs, their tools and handoffs."""

    def __init__(self, start: SDKAgent[Any], replay: Mapping[str, str]) -> None:
        self.start = start
        self.agents: dict[str, SDKAgent[Any]] = {}
        self.handoff_targets: dict[str, str] = {}
        self.tools: dict[str, _SDKTool] = {}
        pending = [start]
        while pending:
            agent = pending.pop()
            if agent.name in self.agents:
                continue
            self.agents[agent.name] = agent
            for t in agent.tools:
                if not isinstance(t, FunctionTool):
                    raise InvalidInput("tools", f"{t.name!r}: only function tools are supported")
                self._add(t.name, t, t.description, t.params_json_schema, replay)
            for h in _handoffs(agent):
                target = _target(h)
                self.handoff_targets[h.tool_name] = target.name
                self._add(h.tool_name, h, h.tool_description, h.input_json_schema, replay)
                pending.append(target)
        unknown = set(replay) - set(self.tools)
        if unknown:
            raise InvalidInput("replay", f"no tool named {sorted(unknown)!r}")

    def _add(
        self, name: str, sdk: Any, description: str, schema: Any, replay: Mapping[str, str]
    ) -> None:
        known = self.tools.get(name)
        if known is not None:
            if known.sdk is not sdk and not isinstance(sdk, Handoff):
                raise InvalidInput("tools", f"two different tools are named {name!r}")
            return
        policy = replay.get(name, "safe")
        if policy not in REPLAYS:
            raise InvalidInput("replay", f"{name}: must be one of {REPLAYS}")
        self.tools[name] = _SDKTool(
            name=name,
            description=description,
            fn=lambda: None,
            replay=policy,  # type: ignore[arg-type]
            approval=False,
            arguments=_Raw,
            takes_ctx=False,
            is_async=True,
            sdk=sdk,
            schema=dict(schema or {"type": "object"}),
        )

    def current(self, messages: Sequence[Message]) -> SDKAgent[Any]:
        """The agent the thread is with: the target of its last successful handoff."""
        for m in reversed(messages):
            meta = m.metadata or {}
            if m.role == "tool" and meta.get("outcome") == "ok":
                target = self.handoff_targets.get(str(meta.get("tool")))
                if target is not None:
                    return self.agents[target]
        return self.start

    def tools_of(self, agent: SDKAgent[Any]) -> list[Any]:
        return list(agent.tools)


class _TeamAgent(Agent):
    """The wakeful agent of a team: a call runs only if the agent that made it has that tool
    (or handoff), as in the SDK; any other name is an ``invalid`` result the model sees."""

    team: _Team

    async def _execute(
        self,
        name: str,
        call: dict[str, Any],
        ctx: NodeContext,
        handed: dict[str, Any] | None = None,
    ) -> tuple[str, str]:
        history = await ctx.history()
        made = next(
            (
                i
                for i, m in enumerate(history)
                if m.role == "assistant"
                and any(c.get("id") == call.get("id") for c in m.tool_calls)
            ),
            len(history),
        )
        caller = self.team.current(history[:made])
        allowed = {t.name for t in caller.tools} | {h.tool_name for h in _handoffs(caller)}
        if name not in allowed:
            return "invalid", f"error: agent {caller.name!r} has no tool named {name!r}"
        return await super()._execute(name, call, ctx, handed)


def _graph_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100] or "agent"


class WakefulRunner:
    """``Runner.run`` for the Agents SDK, durable: ``await WakefulRunner(runtime).run(agent,
    "hi", thread_id="t1")``. ``replay`` sets a tool's replay policy by name (``safe`` |
    ``keyed`` | ``never``); ``max_turns`` bounds the model turns of one run."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        replay: Mapping[str, str] | None = None,
        max_turns: int = 10,
        stream_policy: StreamPolicy | None = None,
        durability: str = "sync",
        streamed: bool = True,
    ) -> None:
        self.runtime = runtime
        self.streamed = streamed
        """Model requests use ``stream_response`` (checkpointed, continued after a crash);
        ``False``: ``get_response``."""
        self.replay = dict(replay or {})
        self.max_turns = max_turns
        self.stream_policy = stream_policy
        self.durability = durability
        self._built: dict[int, tuple[_Team, Agent]] = {}

    def agent(self, starting_agent: SDKAgent[Any]) -> Agent:
        """The wakeful agent (graph) that runs ``starting_agent``: what a fleet worker
        registers as a target."""
        return self._build(starting_agent)[1]

    def _build(self, starting_agent: SDKAgent[Any]) -> tuple[_Team, Agent]:
        key = id(starting_agent)
        if key not in self._built:
            team = _Team(starting_agent, self.replay)
            provider = SDKModelProvider(
                team.current, _handoffs, team.tools_of, streamed=self.streamed
            )
            agent = _TeamAgent(
                _graph_name(starting_agent.name),
                provider,
                tools=list(team.tools.values()),
                max_steps=self.max_turns,
                stream_policy=self.stream_policy,
            )
            agent.team = team
            self._built[key] = (team, agent)
        return self._built[key]

    async def run(
        self,
        starting_agent: SDKAgent[Any],
        input: str,
        *,
        thread_id: str | None = None,
        tenant: str | None = None,
    ) -> WakefulRunResult:
        """Append ``input`` to the thread (a fresh one without ``thread_id``) and run until
        an agent answers without tool calls or ``max_turns`` model turns are used."""
        thread = thread_id or f"oai-{uuid.uuid4().hex}"
        _, agent = self._build(starting_agent)
        handle = await agent.start(
            self.runtime, thread, input, tenant=tenant, durability=self.durability
        )
        return await self._result(starting_agent, await handle.result())

    def run_streamed(
        self,
        starting_agent: SDKAgent[Any],
        input: str,
        *,
        thread_id: str | None = None,
        tenant: str | None = None,
    ) -> WakefulRunResultStreaming:
        """Like the SDK's ``Runner.run_streamed`` (call it inside a running event loop):
        start the durable run and return its ``RunResultStreaming``-like result, whose
        ``stream_events()`` yields the SDK's event types as they happen (live text deltas
        as ``RawResponsesStreamEvent``, committed steps as ``RunItemStreamEvent``, handoffs
        as ``AgentUpdatedStreamEvent``); ``final_output`` once the stream ends."""
        thread = thread_id or f"oai-{uuid.uuid4().hex}"
        team, agent = self._build(starting_agent)
        started: list[RunHandle] = []
        runtime = self.runtime

        async def events() -> AsyncIterator[Event | LiveEvent]:
            snap = await runtime.store.read(thread)
            feed = runtime.subscribe(thread, snap.last_seq if snap is not None else 0)
            try:
                handle = await agent.start(
                    runtime, thread, input, tenant=tenant, durability=self.durability
                )
                started.append(handle)
                async for item in feed:
                    yield item
                    if (
                        isinstance(item, Event)
                        and item.run_id == handle.run_id
                        and item.type in TERMINAL_EVENTS
                    ):
                        break
            finally:
                await feed.aclose()  # type: ignore[attr-defined]

        async def finish() -> WakefulRunResult:
            return await self._result(starting_agent, await started[0].result())

        async def load(after: int) -> list[Message]:
            out: list[Message] = []
            while True:
                page = await runtime.store.messages(thread, after + len(out), 500)
                out.extend(page)
                if len(page) < 500:
                    return out

        return WakefulRunResultStreaming(
            team, input, self.max_turns, events, finish, thread, load, self.streamed
        )

    async def recover(
        self, starting_agent: SDKAgent[Any], thread_id: str, *, tenant: str | None = None
    ) -> WakefulRunResult:
        """Continue a run whose process died (after its claim expired)."""
        _, agent = self._build(starting_agent)
        handle = await self.runtime.recover(thread_id, agent.graph, tenant=tenant)
        return await self._result(starting_agent, await handle.result())

    async def _result(self, starting_agent: SDKAgent[Any], outcome: RunOutcome) -> WakefulRunResult:
        team, _ = self._build(starting_agent)
        state = outcome.state if isinstance(outcome.state, dict) else {}
        messages: list[Message] = []
        while True:  # the whole conversation: the handoff that decides may be old
            page = await self.runtime.store.messages(outcome.thread_id, len(messages), 500)
            messages.extend(page)
            if len(page) < 500:
                break
        last = team.current(messages)
        final = state.get("final")
        schema = output_schema(last)
        if schema is not None and isinstance(final, str) and not schema.is_plain_text():
            final = schema.validate_json(final)
        return WakefulRunResult(
            thread_id=outcome.thread_id,
            run_id=outcome.run_id,
            status=outcome.status,
            final_output=final,
            last_agent=last,
        )
