"""``WakefulAgent``: a PydanticAI agent run as a durable wakeful run.

The run is a one-node wakeful graph (``step``, looping until done) under a fenced claim on
the thread. Each superstep replays the PydanticAI run through PydanticAI's public
interface (``Agent.override`` with a journal model and journal toolsets, the way its own
Temporal and DBOS integrations wrap an agent) and takes exactly one new step, a model
request or a tool call, whose result is committed with the superstep as a thread message
(``wakeful.pydantic_ai.journal``). The superstep after the last model response finds
nothing new to do: the PydanticAI run completes there, from recorded results only."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

import pydantic_core
from pydantic_ai import Agent
from pydantic_ai.agent import AgentRun, AgentRunResult
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.result import StreamedRunResult

from wakeful.agent.recovery import StreamPolicy
from wakeful.errors import InvalidInput
from wakeful.ids import check_id
from wakeful.pydantic_ai.approvals import decisions, pending, question
from wakeful.pydantic_ai.approvals import results as approval_results
from wakeful.pydantic_ai.codec import message_history, tool_message
from wakeful.pydantic_ai.journal import (
    REPLAY_POLICIES,
    Journal,
    JournalModel,
    activate,
    deactivate,
    journal_toolset,
)
from wakeful.pydantic_ai.live import LiveRun, MirrorModel, mirror_toolset
from wakeful.records import Message
from wakeful.runtime import END, START, CompiledGraph, Graph, NodeContext, RunHandle, Runtime


class PydaiState(TypedDict):
    prompt: str
    done: bool
    output: Any
    approvals: dict[str, Any]


class WakefulAgent:
    """``WakefulAgent(agent, name="support", runtime=Runtime(store))`` wraps a PydanticAI
    ``Agent``. ``replay`` sets a tool's replay policy by name (``safe``: runs again after a
    crash; ``keyed``: runs again, ``idempotency_key()`` unchanged; ``never``: once its start
    is recorded it is not run again, its result is ``INDETERMINATE`` if it was lost);
    ``default_replay`` applies to the others. ``max_steps`` bounds the supersteps (model
    requests plus tool calls plus one) of a run. ``stream_policy`` (wakeful's
    ``StreamPolicy``): the checkpoint cadence of a new model step, which streams when the
    model can (a ``FunctionModel`` without ``stream_function`` is requested whole) so a
    crash mid-answer is continued (R1) rather than paid again."""

    def __init__(
        self,
        agent: Agent[Any, Any],
        *,
        name: str,
        runtime: Runtime | None = None,
        replay: Mapping[str, str] | None = None,
        default_replay: str = "safe",
        durability: str = "sync",
        max_steps: int = 200,
        stream_policy: StreamPolicy | None = None,
    ) -> None:
        self.wrapped = agent
        self.name = check_id("agent name", name)
        self.runtime = runtime
        self.replay = dict(replay or {})
        for tool, policy in [*self.replay.items(), ("default_replay", default_replay)]:
            if policy not in REPLAY_POLICIES:
                raise InvalidInput(
                    "replay", f"{tool}: {policy!r} is not one of {', '.join(REPLAY_POLICIES)}"
                )
        self.default_replay = default_replay
        uses_never = "never" in self.replay.values() or default_replay == "never"
        if durability == "exit" and uses_never:
            raise InvalidInput(
                "durability", "tools with replay='never' need sync or async durability"
            )
        self.durability = durability
        self.stream_policy = stream_policy or StreamPolicy()
        """Checkpoint cadence and continuation prompt of streamed model steps."""
        self.graph = self._compile(max_steps)
        # In-process only: the framework's run arguments (deps, settings) are Python objects;
        # a recovering process passes its own to ``recover``.
        self._arguments: dict[str, dict[str, Any]] = {}
        self._results: dict[str, AgentRunResult[Any]] = {}
        self._sessions: dict[str, _Session] = {}
        self._channels: dict[str, LiveRun] = {}
        self.steps_taken = 0
        """Model requests and tool calls this process ran for real (not replayed)."""

    def _compile(self, max_steps: int) -> CompiledGraph:
        g = Graph(PydaiState, name=f"pydantic-ai:{self.name}")
        g.node("step", self._step)
        g.edge(START, "step")
        g.conditional_edge("step", _after_step, ["step"])
        return g.compile(max_steps=max_steps)

    # ---------------------------------------------------------------- the step

    async def _step(self, state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        history = await ctx.history()
        arguments = self._run_arguments(ctx)
        result = await self._advance(ctx, history, str(state.get("prompt") or ""), arguments, 0)
        decided: dict[str, Any] = dict(state.get("approvals") or {})
        while result is not None and (requests := pending(result.output)) is not None:
            ids = [c.tool_call_id for c in requests.approvals]
            if not all(i in decided for i in ids):
                # PydanticAI's answer to the caller until a decision comes: its own output
                self._results[ctx.run_id] = result
                decided.update(decisions(requests, ctx.interrupt(question(requests))))
            again = self._run_arguments(ctx)
            again["message_history"] = result.all_messages()
            again["deferred_tool_results"] = approval_results({i: decided[i] for i in ids})
            used = sum(isinstance(m, ModelResponse) for m in result.new_messages())
            result = await self._advance(ctx, history, None, again, used)
        if result is None:
            self.steps_taken += 1
            return {"done": False, "approvals": decided}
        self._results[ctx.run_id] = result
        self._arguments.pop(ctx.run_id, None)
        for message in _trailing_returns(result, ctx.run_id, ctx.idempotency_key):
            ctx.append_message(message)
        return {
            "done": True,
            "output": pydantic_core.to_jsonable_python(result.output),
            "approvals": decided,
        }

    def _run_arguments(self, ctx: NodeContext) -> dict[str, Any]:
        """The PydanticAI arguments of the run: those ``run`` was given, else those of a
        ``recover`` / ``resume`` of its thread in this process, else none (a worker)."""
        found = self._arguments.get(ctx.run_id, self._arguments.get(f"*{ctx.thread_id}", {}))
        return dict(found)

    async def _advance(
        self,
        ctx: NodeContext,
        history: list[Message],
        prompt: str | None,
        arguments: dict[str, Any],
        used: int,
    ) -> AgentRunResult[Any] | None:
        """Take the run's next step: resume this process's live session of the run when the
        step it handed over is committed (no replay), else start one that replays the
        journal from the start (after a recovery, or a lost commit). ``None``: a step was
        staged; else the PydanticAI run's result."""
        session = self._sessions.get(ctx.run_id)
        if session is not None and not _in_step(session, ctx, history):
            session.task.cancel()
            self._sessions.pop(ctx.run_id, None)
            session = None
        handoff: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if session is None:
            journal = Journal.read(ctx, history, self.replay, self.default_replay)
            journal.stream_policy = self.stream_policy
            journal.session = True
            journal.next_response = used
            journal.handoff = handoff
            journal.publish(self._channels.get(ctx.run_id))
            task = asyncio.ensure_future(self._drive(journal, prompt, history, arguments))
            task.add_done_callback(_quiet)
            session = _Session(journal, task, ctx.fencing_token)
            self._sessions[ctx.run_id] = session
        else:
            journal = session.journal
            journal.ctx, journal.staged, journal.handoff = ctx, [], handoff
            assert journal.resume is not None
            journal.resume.set_result(None)
        try:
            waiting: set[asyncio.Future[Any]] = {handoff, session.task}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            session.task.cancel()
            self._sessions.pop(ctx.run_id, None)
            raise
        if handoff.done():
            return None
        self._sessions.pop(ctx.run_id, None)
        return session.task.result()

    async def _drive(
        self,
        journal: Journal,
        prompt: str | None,
        history: list[Message],
        arguments: dict[str, Any],
    ) -> AgentRunResult[Any]:
        with self._over(journal, history, arguments) as kwargs:
            return await self.wrapped.run(prompt, **kwargs)

    @contextmanager
    def _over(
        self, journal: Journal, history: list[Message], arguments: dict[str, Any]
    ) -> Iterator[dict[str, Any]]:
        """PydanticAI's agent with the journal model and toolsets in place (its public
        ``override``), for the duration; yields the run's keyword arguments."""
        model = arguments.pop("model", None) or self.wrapped.model
        if model is None:
            raise InvalidInput("model", "the PydanticAI agent has no model; pass model=")
        extra = arguments.pop("toolsets", None) or ()
        toolsets = [journal_toolset(t) for t in [*self.wrapped.toolsets, *extra]]
        if arguments.get("message_history") is None:
            arguments["message_history"] = message_history(history, journal.run_id) or None
        token = activate(journal)
        try:
            with self.wrapped.override(model=JournalModel(model), toolsets=toolsets, tools=[]):
                yield arguments
        finally:
            deactivate(token)

    async def _replay(
        self,
        journal: Journal,
        prompt: str | None,
        history: list[Message],
        arguments: dict[str, Any],
    ) -> AgentRunResult[Any] | None:
        """Run the PydanticAI agent over the journal: its result, or ``None`` when a new
        step was recorded instead."""
        try:
            with self._over(journal, history, arguments) as kwargs:
                result = await self.wrapped.run(prompt, **kwargs)
        except Exception:
            if journal.staged:
                return None
            raise
        if journal.staged:  # pragma: no cover - a swallowed StepTaken
            return None
        return result

    # ---------------------------------------------------------------- entry points

    def prepare_input(self, input: Any, run_id: str) -> tuple[dict[str, Any], list[Message]]:
        """As a fleet target (``Registry.add(name, WakefulAgent(...))``): a dispatch's input
        is the prompt (text; another JSON value is sent as its JSON text), appended as the
        run's user message."""
        prompt = input if isinstance(input, str) else pydantic_core.to_json(input).decode()
        user = Message(id=f"m-{run_id}-u", role="user", content=prompt, run_id=run_id)
        return {"prompt": prompt, "done": False, "output": None}, [user]

    def _runtime(self, runtime: Runtime | None) -> Runtime:
        chosen = runtime or self.runtime
        if chosen is None:
            raise InvalidInput("runtime", "pass runtime= to WakefulAgent or to this call")
        return chosen

    async def start(
        self,
        user_prompt: str,
        *,
        thread_id: str | None = None,
        runtime: Runtime | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ) -> RunHandle:
        """Start the durable run and return its handle (``run`` awaits it and returns
        PydanticAI's result)."""
        rt = self._runtime(runtime)
        run_id = f"run-{uuid.uuid4().hex}"
        return await self._begin(user_prompt, thread_id, rt, tenant, kwargs, run_id)

    async def _begin(
        self,
        user_prompt: str,
        thread_id: str | None,
        rt: Runtime,
        tenant: str | None,
        kwargs: dict[str, Any],
        run_id: str,
    ) -> RunHandle:
        thread = check_id("thread_id", thread_id or f"t-{uuid.uuid4().hex}")
        state, user = self.prepare_input(user_prompt, run_id)
        self._arguments[run_id] = kwargs
        handle = await rt.start(
            thread,
            self.graph,
            state,
            durability=self.durability,
            tenant=tenant,
            run_id=run_id,
            messages=user,
        )
        return handle

    async def _execute(
        self,
        user_prompt: str,
        thread_id: str | None,
        runtime: Runtime | None,
        tenant: str | None,
        kwargs: dict[str, Any],
    ) -> tuple[Runtime, str, str]:
        """Run the durable run to its end: ``(runtime, thread_id, run_id)``."""
        rt = self._runtime(runtime)
        handle = await self.start(
            user_prompt, thread_id=thread_id, runtime=rt, tenant=tenant, **kwargs
        )
        try:
            await handle.result()
        finally:
            self._arguments.pop(handle.run_id, None)
        return rt, handle.thread_id, handle.run_id

    async def run(
        self,
        user_prompt: str,
        *,
        thread_id: str | None = None,
        runtime: Runtime | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ) -> AgentRunResult[Any]:
        """Run like PydanticAI's ``Agent.run`` (its keyword arguments kept), as a durable
        run on ``thread_id`` (a fresh thread without it): the prompt, every model response
        and every tool result become the thread's messages, and the thread's earlier
        messages are the run's ``message_history``."""
        rt, thread, run_id = await self._execute(user_prompt, thread_id, runtime, tenant, kwargs)
        return await self._result(rt, thread, run_id, user_prompt, kwargs)

    @asynccontextmanager
    async def run_stream(
        self,
        user_prompt: str,
        *,
        thread_id: str | None = None,
        runtime: Runtime | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[StreamedRunResult[Any, Any]]:
        """PydanticAI's ``run_stream`` over the durable run: PydanticAI's own
        ``StreamedRunResult`` (``stream_text(delta=...)``, ``stream_output``,
        ``get_output``, messages) whose deltas are the durable run's model step as the
        provider sends them (``wakeful.pydantic_ai.live``), while the run checkpoints and
        commits as ``run`` does. Leaving the block early does not stop the durable run; a
        normal exit waits for its end."""
        async with (
            self._mirrored(user_prompt, thread_id, runtime, tenant, kwargs) as kw,
            self.wrapped.run_stream(user_prompt, **kw) as stream,
        ):
            yield stream

    @asynccontextmanager
    async def iter(
        self,
        user_prompt: str,
        *,
        thread_id: str | None = None,
        runtime: Runtime | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AgentRun[Any, Any]]:
        """PydanticAI's ``iter`` over the durable run: its graph nodes follow the durable
        run step by step (a model request node streams the durable step live)."""
        async with (
            self._mirrored(user_prompt, thread_id, runtime, tenant, kwargs) as kw,
            self.wrapped.iter(user_prompt, **kw) as agent_run,
        ):
            yield agent_run

    @asynccontextmanager
    async def _mirrored(
        self,
        user_prompt: str,
        thread_id: str | None,
        runtime: Runtime | None,
        tenant: str | None,
        kwargs: dict[str, Any],
    ) -> AsyncIterator[dict[str, Any]]:
        """Start the durable run and yield the keyword arguments of its mirror run (the
        PydanticAI agent over ``MirrorModel`` and ``MirrorToolset``)."""
        rt = self._runtime(runtime)
        live = LiveRun()
        run_id = f"run-{uuid.uuid4().hex}"
        self._channels[run_id] = live
        arguments = dict(kwargs)
        model = arguments.pop("model", None) or self.wrapped.model
        if model is None:
            raise InvalidInput("model", "the PydanticAI agent has no model; pass model=")
        extra = arguments.pop("toolsets", None) or ()
        toolsets = [mirror_toolset(t, live) for t in [*self.wrapped.toolsets, *extra]]
        try:
            handle = await self._begin(user_prompt, thread_id, rt, tenant, kwargs, run_id)
            ended = asyncio.ensure_future(handle.result())
            ended.add_done_callback(lambda t: live.close(_failure(t)))
            if arguments.get("message_history") is None:
                history = await _all_messages(rt, handle.thread_id)
                arguments["message_history"] = message_history(history, run_id) or None
            mirror = MirrorModel(model, live)
            with self.wrapped.override(model=mirror, toolsets=toolsets, tools=[]):
                yield arguments
            await ended
        finally:
            self._channels.pop(run_id, None)
            self._arguments.pop(run_id, None)
            self._results.pop(run_id, None)

    def run_sync(self, user_prompt: str, **kwargs: Any) -> AgentRunResult[Any]:
        """``run`` on a new event loop (refused inside a running loop, as PydanticAI's)."""
        return asyncio.run(self.run(user_prompt, **kwargs))

    async def recover(
        self,
        thread_id: str,
        *,
        runtime: Runtime | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ) -> AgentRunResult[Any]:
        """Continue the thread's run whose process died (once its claim expired): recorded
        model responses and tool results are reused, the rest runs (``kwargs``: the run's
        PydanticAI arguments, e.g. ``deps``)."""
        rt = self._runtime(runtime)
        self._arguments[f"*{thread_id}"] = kwargs
        try:
            handle = await rt.recover(thread_id, self.graph, tenant=tenant)
            outcome = await handle.result()
            snap = await rt.store.read(thread_id)
            prompt = ""
            if snap is not None:
                for message in await _all_messages(rt, thread_id):
                    if message.run_id == outcome.run_id and message.role == "user":
                        prompt = str(message.content or "")
            return await self._result(rt, thread_id, outcome.run_id, prompt, kwargs)
        finally:
            self._arguments.pop(f"*{thread_id}", None)

    async def resume(
        self,
        thread_id: str,
        decision: Any,
        *,
        runtime: Runtime | None = None,
        tenant: str | None = None,
        **kwargs: Any,
    ) -> AgentRunResult[Any]:
        """Answer the approvals a suspended run waits for (its output was PydanticAI's
        ``DeferredToolRequests``): ``"approve"``, ``"deny"``, ``{"approve": False,
        "reason": ...}`` for all the calls, or ``{call_id: decision}``. The run continues
        with them as PydanticAI's ``deferred_tool_results``; returns its result."""
        rt = self._runtime(runtime)
        snap = await rt.store.read(thread_id)
        latest = snap.checkpoint if snap is not None else None
        tickets = [t["id"] for t in (latest.metadata.get("tickets", []) if latest else [])]
        if not tickets:
            raise InvalidInput("thread_id", f"{thread_id!r} has no run waiting for approvals")
        self._arguments[f"*{thread_id}"] = kwargs
        try:
            handle = await rt.resume(thread_id, self.graph, {tickets[-1]: decision}, tenant=tenant)
            outcome = await handle.result()
            prompt = ""
            for message in await _all_messages(rt, thread_id):
                if message.run_id == outcome.run_id and message.role == "user":
                    prompt = str(message.content or "")
            return await self._result(rt, thread_id, outcome.run_id, prompt, kwargs)
        finally:
            self._arguments.pop(f"*{thread_id}", None)

    async def _result(
        self, rt: Runtime, thread_id: str, run_id: str, prompt: str, kwargs: dict[str, Any]
    ) -> AgentRunResult[Any]:
        found = self._results.pop(run_id, None)
        if found is not None:
            return found
        # Finished elsewhere: replay the recorded run (no step may be new).
        history = await _all_messages(rt, thread_id)
        journal = Journal.read(None, history, self.replay, self.default_replay, run_id=run_id)
        journal.live = False
        result = await self._replay(journal, prompt, history, dict(kwargs))
        if result is None:  # pragma: no cover - live=False refuses new steps
            raise InvalidInput("run", f"run {run_id!r} has not finished")
        return result


@dataclass
class _Session:
    """A PydanticAI run alive between the supersteps of its wakeful run (this process)."""

    journal: Journal
    task: asyncio.Future[AgentRunResult[Any]]
    token: int


def _failure(task: asyncio.Future[Any]) -> BaseException | None:
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception()


def _quiet(task: asyncio.Future[Any]) -> None:
    """Retrieve the exception of a session no node waits for any more (one that timed out
    waiting for its next superstep) so it is not logged as never retrieved; a node that
    waits gets it from ``task.result()``."""
    if not task.cancelled():
        task.exception()


def _in_step(session: _Session, ctx: NodeContext, history: list[Message]) -> bool:
    """Whether ``session`` waits for exactly this superstep: same claim, its last staged
    step committed (on the thread), nothing else changed."""
    journal = session.journal
    if session.task.done() or session.token != ctx.fencing_token or journal.resume is None:
        return False
    if journal.resume.done() or not journal.staged:
        return False
    return journal.staged[-1].id in {m.id for m in history if m.run_id == ctx.run_id}


def _after_step(state: dict[str, Any]) -> str:
    return END if state.get("done") else "step"


def _trailing_returns(result: AgentRunResult[Any], run_id: str, key: str) -> list[Message]:
    """The tool returns PydanticAI adds after the last response (the output tool's), so the
    thread's conversation has no tool call without its result."""
    messages = result.new_messages()
    if not messages or not isinstance(messages[-1], ModelRequest):
        return []
    return [
        tool_message(
            f"m-{key}-o{i}",
            run_id,
            part.tool_call_id,
            part.tool_name,
            "safe",
            {"outcome": "ok", "value": part.content},
        )
        for i, part in enumerate(messages[-1].parts)
        if isinstance(part, ToolReturnPart)
    ]


async def _all_messages(rt: Runtime, thread_id: str) -> list[Message]:
    out: list[Message] = []
    while True:
        page = await rt.store.messages(thread_id, after=len(out), limit=500)
        out.extend(page)
        if len(page) < 500:
            return out
