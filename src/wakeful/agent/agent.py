"""An agent is a prebuilt graph: a model node that streams one assistant turn, one task per
tool call, and back to the model until a final answer or the step limit.

The conversation lives in the thread's messages: the user's message is committed with the
run's first checkpoint, each assistant turn with the model step, each tool result with its
tool task, so a commit appends only the new messages and a recovered run never repeats a
committed one."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict

import msgspec

from wakeful.agent.delegation import delegated
from wakeful.agent.limiting import CallLimits, limits_of
from wakeful.agent.observe import ToolObserver
from wakeful.agent.recovery import StreamPolicy, StreamRecovery
from wakeful.agent.tools import ArgumentsInvalid, Tool, ToolContext, ToolSleep
from wakeful.errors import InvalidInput, OutcomeUnknown
from wakeful.ids import check_id
from wakeful.limits import RateLimit, check_limits
from wakeful.metrics import Metrics
from wakeful.providers.base import ModelRequest, Provider
from wakeful.records import Event, Message
from wakeful.runtime import END, START, CompiledGraph, Graph, NodeContext, Runtime, Send
from wakeful.runtime.context import Interrupt
from wakeful.runtime.events import LiveEvent
from wakeful.runtime.handle import RunHandle
from wakeful.runtime.history import committed_at, last_user_count, message_position
from wakeful.runtime.results import RunOutcome

INDETERMINATE = (
    "Indeterminate: this call may have started before the process running it stopped, and "
    "its outcome is unknown. It was not run again."
)
TERMINAL_EVENTS = frozenset(
    ("run.completed", "run.suspended", "run.failed", "run.cancelled", "run.indeterminate")
)


class AgentState(TypedDict):
    calls: list[dict[str, Any]]
    turns: int
    final: str | None
    stopped: str | None


class Approval(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call waiting for a human decision: answer ``ticket_id`` with ``"approve"``,
    ``"deny"`` or ``{"approve": bool, "reason": str}``."""

    ticket_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]


class AgentReply(msgspec.Struct, frozen=True, kw_only=True):
    """What ``Agent.run`` and ``Agent.resume`` return.

    - ``status == "completed"``: ``text`` is the final answer.
    - ``status == "suspended"``: ``approvals`` are the tool calls waiting for a decision;
      answer them with ``Agent.resume(runtime, thread_id, {approval.ticket_id: "approve"})``.
    - ``stopped`` names why a run ended without an answer (e.g. the step limit)."""

    thread_id: str
    run_id: str
    status: str
    text: str | None
    approvals: tuple[Approval, ...] = ()
    stopped: str | None = None


class Agent:
    """``Agent(name, model, instructions, tools, max_steps)``; ``max_steps`` bounds the model
    turns of one run. ``limits``: rate limits (``wakeful.limits.RateLimit``) every model call
    of the agent takes from, with those of its provider; they need a store that keeps
    rate-limit buckets."""

    def __init__(
        self,
        name: str,
        model: Provider,
        instructions: str = "",
        tools: Sequence[Tool] = (),
        max_steps: int = 10,
        *,
        stream_policy: StreamPolicy | None = None,
        sleep: Any = asyncio.sleep,
        limits: RateLimit | Sequence[RateLimit] | None = None,
        patches: Sequence[str] = (),
    ) -> None:
        self.name = check_id("agent name", name)
        self.patches = tuple(patches)
        """The patches this agent's code has: ``ctx.patched(id)`` in its tools."""
        self.model = model
        self.instructions = instructions
        self.tools = {t.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise InvalidInput("tools", "two tools have the same name")
        if max_steps < 1:
            raise InvalidInput("max_steps", "must be at least 1")
        self.max_steps = max_steps
        self.stream_policy = stream_policy or StreamPolicy()
        self.sleep = sleep
        self.limits = check_limits(limits)
        """Rate limits every model call of this agent takes from (``wakeful.limits``),
        besides those configured on its provider."""
        self.counters: dict[str, int] = {}
        self.metrics: Metrics | None = None
        """Set (by a worker, or by you) to record model, tool and stream-checkpoint
        metrics there."""
        self.graph = self._compile()

    # ---------------------------------------------------------------- graph

    def _compile(self) -> CompiledGraph:
        g = Graph(AgentState, name=f"agent:{self.name}", patches=self.patches)
        g.node("model", self._model).node("tool", self._tool).node("limit", self._limit)
        g.edge(START, "model")
        g.conditional_edge("model", self._after_model, ["tool"])
        g.conditional_edge("tool", self._after_tools, ["model", "limit"])
        return g.compile(max_steps=4 * self.max_steps + 4)

    def _after_model(self, state: dict[str, Any]) -> Any:
        calls = state.get("calls") or []
        return [Send("tool", call) for call in calls] if calls else END

    def _after_tools(self, state: dict[str, Any]) -> str:
        if state.get("final") is not None:
            # only a handoff's tool task writes ``final`` (a turn with calls clears it): the
            # other agent answered. END is not among the declared targets on purpose: they
            # are the graph's fingerprint, which every agent thread recorded (decision 0056)
            return END
        return "model" if int(state.get("turns") or 0) < self.max_steps else "limit"

    async def _model(self, state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        history = await ctx.history()
        request = ModelRequest(
            model=str(getattr(self.model, "model", self.name)),
            messages=tuple(history),
            system=self.instructions or None,
            tools=tuple(t.spec for t in self.tools.values()),
        )
        message_id = f"m-{ctx.idempotency_key}-a"
        recovery = StreamRecovery(
            provider=self.model,
            policy=self.stream_policy,
            run_id=ctx.run_id,
            thread_id=ctx.thread_id,
            task_id=ctx.task_id,
            token=ctx.fencing_token,
            checkpoints=getattr(ctx.store, "stream_checkpoints", None),
            sleep=self.sleep,
            live=ctx.emit_live,
            live_wanted=ctx.wants_live,
            counters=self.counters,
            on_checkpoint_failure=self._checkpoint_failed,
            waiting=ctx.waiting,
            metrics=self.metrics,
            message_id=message_id,
            resume=not ctx.fresh,
            limits=CallLimits.for_store(
                limits_of(self.model, self),
                ctx.store,
                self.sleep,
                live=ctx.emit_live,
                metrics=self.metrics,
                run_id=ctx.run_id,
                thread_id=ctx.thread_id,
                fencing_token=ctx.fencing_token,
            ),
        )
        turn = await recovery.turn(request)
        ctx.append_message(
            Message(
                id=message_id,
                role="assistant",
                content=turn.text,
                tool_calls=turn.tool_calls,
                run_id=ctx.run_id,
                metadata={
                    "stop_reason": turn.stop_reason,
                    "usage": msgspec.to_builtins(turn.usage) if turn.usage else None,
                    "recoveries": turn.recoveries,
                },
            )
        )
        # The turn as committed, for stream clients: what their live deltas must add up to.
        ctx.emit(
            "message.completed",
            {"message_id": message_id, "content": turn.text, "tool_calls": turn.tool_calls},
        )
        if turn.recoveries:
            ctx.emit("model.recovered", {"plans": turn.recoveries})
        ctx.on_committed(recovery.discard)
        return {
            "calls": turn.tool_calls,
            "turns": int(state.get("turns") or 0) + 1,
            "final": None if turn.tool_calls else turn.text,
        }

    def _checkpoint_failed(self) -> None:
        if self.metrics is not None:
            self.metrics.stream_checkpoint_failures.inc()

    async def _tool(self, call: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        name = str(call.get("name"))
        handed: dict[str, Any] = {}  # a completed handoff: the child that answered
        outcome, content = await self._execute(name, call, ctx, handed)
        tool = self.tools.get(name)
        ctx.append_message(
            Message(
                id=f"m-{ctx.idempotency_key}-r",
                role="tool",
                content=content,
                tool_call_id=str(call.get("id")),
                run_id=ctx.run_id,
                # the replay policy too: what an operator compensating a rollback needs
                metadata={
                    "tool": name,
                    "outcome": outcome,
                    "replay": tool.replay if tool is not None else None,
                },
            )
        )
        ctx.emit_live("tool.finished", {"call_id": call.get("id"), "outcome": outcome})
        if not handed:
            return {}
        # A handoff: the other agent's reply is this run's final answer, in its conversation
        # too; ``_after_tools`` ends the run instead of asking the model again.
        ctx.append_message(
            Message(
                id=f"m-{ctx.idempotency_key}-h",
                role="assistant",
                content=content,
                run_id=ctx.run_id,
                metadata={"handoff": handed},
            )
        )
        ctx.emit("agent.handed_off", {"call_id": call.get("id"), **handed})
        return {"final": content}

    async def _execute(
        self,
        name: str,
        call: dict[str, Any],
        ctx: NodeContext,
        handed: dict[str, Any] | None = None,
    ) -> tuple[str, str]:
        tool = self.tools.get(name)
        if tool is None:
            return "invalid", f"error: there is no tool named {name!r}"
        try:
            arguments = tool.parse(str(call.get("arguments") or ""))
        except ArgumentsInvalid as exc:
            return "invalid", f"error: {exc}; the call was not run"
        if tool.approval:
            decision = ctx.interrupt(
                {"approval": {"call_id": call.get("id"), "tool": name, "arguments": arguments}}
            )
            approved, reason = _decision(decision)
            if not approved:
                return "denied", f"denied: {reason}" if reason else "denied by the user"
        woke = ctx.next_sleep_answer()
        if woke is not None:
            # the call slept (ToolContext.sleep) and this is its wake-up: it is not run
            # again; the sleep is answered and the turn goes on with its result
            until = datetime.fromisoformat(str(woke))
            await ctx.sleep_until(until)
            return "ok", f"slept until {until.isoformat()}"
        if tool.delegate is not None:  # a child run: its join suspends this run meanwhile
            outcome, content, link = await delegated(tool, arguments, ctx, self.name)
            if handed is not None and link is not None:
                handed.update(link)
            return outcome, content
        seen = ToolObserver(
            name, str(call.get("id")), tool.replay, ctx.idempotency_key, self.metrics
        )
        try:
            outcome, content = await self._run_tool(tool, arguments, call, ctx, seen)
        except ToolSleep as sleep:
            seen.done("slept", ran=True)
            await ctx.sleep_until(sleep.until)  # the run sleeps: its claim is released
            raise AssertionError("an unanswered sleep returned") from None
        except Interrupt:  # the call waits for a child run; it is not over
            raise
        except BaseException as exc:
            seen.done("error", ran=False, error=exc)
            raise
        seen.done(outcome, ran=outcome != "indeterminate")
        return outcome, content

    async def _run_tool(
        self,
        tool: Tool,
        arguments: dict[str, Any],
        call: dict[str, Any],
        ctx: NodeContext,
        seen: ToolObserver,
    ) -> tuple[str, str]:
        name = tool.name
        if tool.replay == "never":
            if ctx.has_mark("started"):
                seen.run("indeterminate")
                return _indeterminate(name, call, ctx)
            await ctx.mark("started")
        ctx.emit_live("tool.started", {"call_id": call.get("id"), "tool": name})
        tool_ctx = ToolContext(
            thread_id=ctx.thread_id,
            run_id=ctx.run_id,
            call_id=str(call.get("id")),
            idempotency_key=ctx.idempotency_key,
            fencing_token=ctx.fencing_token,
            replay=tool.replay,
            patches=ctx.patches,
            clock=ctx.clock,
            node=ctx,
        )
        try:
            # a tool call may take long: the claim stays renewed meanwhile
            with ctx.waiting(), seen.run("replayed" if ctx.recovered else "run"):
                value = await tool.call(arguments, tool_ctx)
        except Interrupt:  # a join (``ToolContext.join``): the run suspends
            raise
        except OutcomeUnknown:
            # Not an error: the effect may have happened, and a model told "failed" may call
            # again under a new idempotency key.
            return _indeterminate(name, call, ctx)
        except Exception as exc:
            return "error", f"error: {type(exc).__name__}: {exc}"
        if isinstance(value, str) and value == INDETERMINATE:
            return _indeterminate(name, call, ctx)
        if isinstance(value, str):
            return "ok", value
        try:
            return "ok", msgspec.json.encode(value).decode()
        except TypeError:
            return "ok", str(value)

    async def _limit(self, state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        ctx.emit("agent.step_limit", {"max_steps": self.max_steps})
        return {"stopped": "max_steps", "calls": []}

    # ---------------------------------------------------------------- entry points

    async def start(
        self,
        runtime: Runtime,
        thread_id: str,
        message: str | Message,
        *,
        tenant: str | None = None,
        durability: str = "sync",
    ) -> RunHandle:
        if durability == "exit" and any(t.replay == "never" for t in self.tools.values()):
            raise InvalidInput(
                "durability", "tools with replay='never' need sync or async durability"
            )
        run_id = f"run-{uuid.uuid4().hex}"
        user = (
            message
            if isinstance(message, Message)
            else Message(id=f"m-{run_id}-u", role="user", content=message, run_id=run_id)
        )
        return await runtime.start(
            thread_id,
            self.graph,
            {"calls": [], "turns": 0, "final": None, "stopped": None},
            durability=durability,
            tenant=tenant,
            run_id=run_id,
            messages=(user,),
        )

    async def run(
        self,
        runtime: Runtime,
        thread_id: str,
        message: str | Message,
        *,
        tenant: str | None = None,
        durability: str = "sync",
    ) -> AgentReply:
        """Append ``message`` to the thread and run the agent until a final answer, a
        pending approval or the step limit."""
        handle = await self.start(runtime, thread_id, message, tenant=tenant, durability=durability)
        return _reply(await handle.result())

    async def resume(
        self,
        runtime: Runtime,
        thread_id: str,
        decisions: Mapping[str, Any],
        *,
        tenant: str | None = None,
    ) -> AgentReply:
        """Answer pending approvals (``{ticket_id: "approve" | "deny" | {...}}``)."""
        handle = await runtime.resume(thread_id, self.graph, decisions, tenant=tenant)
        return _reply(await handle.result())

    async def recover(
        self, runtime: Runtime, thread_id: str, *, tenant: str | None = None
    ) -> AgentReply:
        """Continue a run whose process died (after its claim expired)."""
        handle = await runtime.recover(thread_id, self.graph, tenant=tenant)
        return _reply(await handle.result())

    async def regenerate(
        self,
        runtime: Runtime,
        thread_id: str,
        *,
        tenant: str | None = None,
        durability: str | None = None,
    ) -> AgentReply:
        """Answer the thread's last user message again: a run replayed from the checkpoint
        that committed it (before the assistant's answer). The thread branches there; the
        previous answer stays readable on the abandoned branch (docs/time-travel.md).
        Refused with ``ThreadBusy`` while a run holds the thread."""
        index = await last_user_count(runtime.store, thread_id)
        at = await committed_at(runtime.store, thread_id, index, tenant=tenant)
        handle = await runtime.replay(
            thread_id, self.graph, at, tenant=tenant, durability=durability
        )
        return _reply(await handle.result())

    async def edit(
        self,
        runtime: Runtime,
        thread_id: str,
        message_id: str,
        new_content: str,
        *,
        tenant: str | None = None,
        durability: str | None = None,
    ) -> AgentReply:
        """Replace the user message ``message_id`` with ``new_content`` and run on from
        there: the thread branches at the checkpoint that committed that message, keeping
        only the messages before it, and the edited message (a new message, whose
        ``metadata["edits"]`` names the one it replaces) starts a new run. Everything after
        the original message stays readable on the abandoned branch."""
        check_id("message_id", message_id)
        index, original = await message_position(runtime.store, thread_id, message_id)
        if original.role != "user":
            raise InvalidInput("message_id", f"{message_id!r} is a {original.role} message")
        at = await committed_at(runtime.store, thread_id, index + 1, tenant=tenant)
        run_id = f"run-{uuid.uuid4().hex}"
        user = Message(
            id=f"m-{run_id}-u",
            role="user",
            content=new_content,
            run_id=run_id,
            metadata={"edits": message_id},
        )
        handle = await runtime.replay(
            thread_id,
            self.graph,
            at,
            {"calls": [], "turns": 0, "final": None, "stopped": None},
            messages=(user,),
            keep_messages=index,
            run_id=run_id,
            tenant=tenant,
            durability=durability,
        )
        return _reply(await handle.result())

    async def stream(
        self,
        runtime: Runtime,
        thread_id: str,
        message: str | Message,
        *,
        tenant: str | None = None,
        durability: str = "sync",
    ) -> AsyncIterator[Event | LiveEvent]:
        """Run like ``run`` and yield its events as they happen: live ``text.delta``,
        ``tool.started`` and ``tool.finished`` events and the durable events, ending with the
        run's terminal event."""
        snap = await runtime.store.read(thread_id)
        after = snap.last_seq if snap is not None else 0
        events = runtime.subscribe(thread_id, after)
        try:
            handle = await self.start(
                runtime, thread_id, message, tenant=tenant, durability=durability
            )
            async for item in events:
                yield item
                if (
                    isinstance(item, Event)
                    and item.run_id == handle.run_id
                    and item.type in TERMINAL_EVENTS
                ):
                    break
            await asyncio.wait({asyncio.ensure_future(handle.result())})
        finally:
            await events.aclose()  # type: ignore[attr-defined]


def _indeterminate(name: str, call: dict[str, Any], ctx: NodeContext) -> tuple[str, str]:
    """Record a call whose outcome is unknown: the ``tool.indeterminate`` event and the
    ``indeterminate`` outcome, whichever way it was found out."""
    ctx.emit("tool.indeterminate", {"call_id": call.get("id"), "tool": name})
    return "indeterminate", INDETERMINATE


def _decision(answer: Any) -> tuple[bool, str | None]:
    if isinstance(answer, bool):
        return answer, None
    if isinstance(answer, str):
        return answer.lower() in ("approve", "approved", "yes", "allow"), None
    if isinstance(answer, Mapping):
        approved = bool(answer.get("approve", answer.get("approved", False)))
        reason = answer.get("reason")
        return approved, str(reason) if reason is not None else None
    return False, "unrecognised decision"


def _reply(outcome: RunOutcome) -> AgentReply:
    state = outcome.state if isinstance(outcome.state, dict) else {}
    approvals = tuple(
        Approval(
            ticket_id=t.id,
            call_id=str(t.question["approval"]["call_id"]),
            tool=str(t.question["approval"]["tool"]),
            arguments=dict(t.question["approval"]["arguments"]),
        )
        for t in outcome.tickets
        if isinstance(t.question, dict) and "approval" in t.question
    )
    return AgentReply(
        thread_id=outcome.thread_id,
        run_id=outcome.run_id,
        status=outcome.status,
        text=state.get("final"),
        approvals=approvals,
        stopped=state.get("stopped"),
    )
