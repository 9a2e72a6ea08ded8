"""The step journal of one PydanticAI run on a wakeful thread.

A wakeful superstep re-executes the PydanticAI run from its start (as PydanticAI's own
Temporal and DBOS integrations replay a workflow): every model request and tool call that
is already recorded on the thread (messages of this run) returns its recorded result
without any side effect; the *first* one that is not recorded is executed for real, its
result is staged as a thread message (committed atomically with the superstep) and the
replay stops with ``StepTaken``. So every model response and every tool result is durable
before the next one starts, and a run recovered in another process pays for nothing that
was already recorded.

Other new calls started concurrently with the first one (PydanticAI runs the tool calls of
one response in parallel) wait for it to finish and then stop too, without running: they
are the next supersteps' work."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from wakeful.agent.recovery import StreamPolicy
from wakeful.errors import InvalidInput, OutcomeUnknown
from wakeful.pydantic_ai.codec import (
    dump_response,
    load_response,
    replay_result,
    response_message,
    tool_message,
)
from wakeful.pydantic_ai.live import LiveRun
from wakeful.pydantic_ai.streams import streamed_step
from wakeful.records import Message
from wakeful.runtime import NodeContext

REPLAY_POLICIES = ("safe", "keyed", "never")
INDETERMINATE = (
    "Indeterminate: this call may have started before the process running it stopped, and "
    "its outcome is unknown. It was not run again."
)

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("wakeful_pydai_key", default=None)


def idempotency_key() -> str:
    """The idempotency key of the tool call running now (deterministic per thread, run and
    tool call id, so a ``keyed`` tool re-run after a crash sends the same key). Raises
    ``InvalidInput`` outside a tool call of a ``WakefulAgent`` run."""
    key = _KEY.get()
    if key is None:
        raise InvalidInput("idempotency_key", "called outside a WakefulAgent tool call")
    return key


class StepTaken(Exception):
    """Raised to stop a replay after the superstep's one new step was recorded (or, for a
    concurrent new call, after that step finished). Never escapes ``WakefulAgent``."""


@dataclass
class Journal:
    """What this run has recorded so far, read from the thread, and the new step this
    superstep takes (at most one)."""

    ctx: NodeContext | None
    run_id: str
    responses: list[ModelResponse]
    tool_results: dict[str, dict[str, Any]]
    replay: dict[str, str]
    default_replay: str
    stream_policy: StreamPolicy | None = None
    """Set: new model steps stream with checkpoints (``wakeful.pydantic_ai.streams``)."""
    live: bool = True
    """False for a replay-only pass (the result of a finished run): any new step is an
    error, not work."""
    next_response: int = 0
    taken: bool = False
    staged: list[Message] = field(default_factory=list)
    session: bool = False
    """Set: the run stays alive between supersteps (``WakefulAgent``'s sessions): after a
    new step is staged it hands over to the node (``handoff``) and waits until the next
    superstep resumes it (``resume``), instead of stopping with ``StepTaken``."""
    resume_timeout: float = 600.0
    handoff: asyncio.Future[None] | None = None
    resume: asyncio.Future[None] | None = None
    channel: LiveRun | None = None
    """Set by ``run_stream`` / ``iter``: this process's mirror of the run, fed here."""
    _step_done: asyncio.Event = field(default_factory=asyncio.Event)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def read(
        cls,
        ctx: NodeContext | None,
        history: list[Message],
        replay: dict[str, str],
        default_replay: str,
        *,
        run_id: str | None = None,
    ) -> Journal:
        run = run_id if ctx is None else ctx.run_id
        if run is None:
            raise InvalidInput("run_id", "a journal needs a run")
        responses: list[ModelResponse] = []
        results: dict[str, dict[str, Any]] = {}
        for message in history:
            if message.run_id != run:
                continue
            meta = message.metadata or {}
            if message.role == "assistant" and "pydantic_ai" in meta:
                responses.append(load_response(meta["pydantic_ai"]))
            elif message.role == "tool" and message.tool_call_id and "result" in meta:
                results[message.tool_call_id] = dict(meta["result"])
        return cls(ctx, run, responses, results, replay, default_replay)

    def publish(self, channel: LiveRun | None) -> None:
        """Feed ``channel`` from now on, starting with what is recorded."""
        self.channel = channel
        if channel is None:
            return
        for i, response in enumerate(self.responses):
            channel.response(i, response)
        for call_id, result in self.tool_results.items():
            channel.tool(call_id, result)

    @property
    def node(self) -> NodeContext:
        if self.ctx is None:
            raise InvalidInput(
                "run", "the recorded run diverged from its replay (a step has no record)"
            )
        return self.ctx

    async def _claim_step(self) -> None:
        """Become this superstep's new step, or wait for it and stop (in a session: wait
        for the steps before it to be committed)."""
        if not self.live:
            raise InvalidInput(
                "run", "the recorded run diverged from its replay (a step has no record)"
            )
        if self.session:
            await self._lock.acquire()
            return
        if self.taken:
            await self._step_done.wait()
            raise StepTaken()
        self.taken = True

    def _finish_step(self, message: Message) -> None:
        self.staged.append(message)
        self.node.append_message(message)
        self._step_done.set()

    def _abort_step(self) -> None:
        self._step_done.set()
        if self.session and self._lock.locked():
            self._lock.release()

    async def _end_step(self) -> None:
        """The step is staged: stop the replay, or, in a session, hand over to the node and
        wait for the superstep that committed it to resume this run."""
        if not self.session:
            raise StepTaken()
        self.resume = asyncio.get_running_loop().create_future()
        if self.handoff is not None and not self.handoff.done():
            self.handoff.set_result(None)
        try:
            await asyncio.wait_for(self.resume, self.resume_timeout)
        finally:
            self._lock.release()

    # -------------------------------------------------------------- model steps

    def recorded_response(self) -> ModelResponse | None:
        if self.next_response < len(self.responses):
            response = self.responses[self.next_response]
            self.next_response += 1
            return response
        return None

    async def record_response(
        self,
        response: ModelResponse,
        recoveries: list[str] | None = None,
        sent: list[ModelMessage] | None = None,
    ) -> ModelResponse:
        """Stage ``response`` as this superstep's step and stop the replay (never returns).
        Tool returns PydanticAI made itself (a denied approval) in the request ``sent`` are
        staged first, so the thread's conversation has every call's result."""
        index = len(self.responses)
        last = sent[-1] if sent else None
        if isinstance(last, ModelRequest):
            for i, part in enumerate(last.parts):
                if isinstance(part, ToolReturnPart) and part.tool_call_id not in self.tool_results:
                    self.node.append_message(
                        tool_message(
                            f"m-{self.node.idempotency_key}-d{i}",
                            self.node.run_id,
                            part.tool_call_id,
                            part.tool_name,
                            self.replay.get(part.tool_name, self.default_replay),
                            {"outcome": "deferred", "value": part.content},
                        )
                    )
        message = response_message(
            f"m-{self.node.idempotency_key}-a{index}", self.node.run_id, response
        )
        if recoveries:
            message.metadata["recoveries"] = recoveries
        self._finish_step(message)
        if self.channel is not None:
            self.channel.response(index, response)
        self.responses.append(response)
        self.next_response = len(self.responses)
        await self._end_step()
        return response

    # -------------------------------------------------------------- tool steps

    async def call_tool(self, name: str, call_id: str, run: Any) -> Any:
        """Replay the call's recorded result, or run it under its replay policy."""
        recorded = self.tool_results.get(call_id)
        if recorded is not None:
            return replay_result(recorded)
        await self._claim_step()
        policy = self.replay.get(name, self.default_replay)
        mark = "started-" + hashlib.sha256(call_id.encode()).hexdigest()[:16]
        result: dict[str, Any]
        try:
            if policy == "never" and self.node.has_mark(mark):
                self.node.emit("tool.indeterminate", {"call_id": call_id, "tool": name})
                result = {"outcome": "indeterminate", "value": INDETERMINATE}
            else:
                if policy == "never":
                    await self.node.mark(mark)
                result = await self._run(name, call_id, policy, run)
        except BaseException:
            self._abort_step()
            raise
        message = tool_message(
            f"m-{self.node.idempotency_key}-t{len(self.tool_results)}",
            self.node.run_id,
            call_id,
            name,
            policy,
            result,
        )
        self._finish_step(message)
        self.tool_results[call_id] = dict(message.metadata["result"])
        if self.channel is not None:
            self.channel.tool(call_id, message.metadata["result"])
        await self._end_step()
        # what a replay returns: the recorded (JSON) form, so both paths agree
        return replay_result(message.metadata["result"])

    async def _run(self, name: str, call_id: str, policy: str, run: Any) -> dict[str, Any]:
        raw = f"{self.node.thread_id}\x00{self.node.run_id}\x00{call_id}".encode()
        token = _KEY.set(hashlib.sha256(raw).hexdigest()[:32])
        self.node.emit_live("tool.started", {"call_id": call_id, "tool": name})
        try:
            with self.node.waiting():
                value = await run()
        except ModelRetry as exc:
            return {"outcome": "retry", "message": exc.message}
        except OutcomeUnknown:
            self.node.emit("tool.indeterminate", {"call_id": call_id, "tool": name})
            return {"outcome": "indeterminate", "value": INDETERMINATE}
        finally:
            _KEY.reset(token)
        if isinstance(value, str) and value == INDETERMINATE:
            self.node.emit("tool.indeterminate", {"call_id": call_id, "tool": name})
            return {"outcome": "indeterminate", "value": INDETERMINATE}
        return {"outcome": "ok", "value": value}


_ACTIVE: contextvars.ContextVar[Journal | None] = contextvars.ContextVar(
    "wakeful_pydai_journal", default=None
)


def active() -> Journal:
    journal = _ACTIVE.get()
    if journal is None:
        raise InvalidInput("run", "a WakefulAgent step ran outside a WakefulAgent run")
    return journal


def activate(journal: Journal) -> contextvars.Token[Journal | None]:
    return _ACTIVE.set(journal)


def deactivate(token: contextvars.Token[Journal | None]) -> None:
    _ACTIVE.reset(token)


class JournalModel(WrapperModel):
    """A model whose requests are journal steps: a recorded response is returned as it was;
    a new one is requested from the wrapped model, recorded, and ends the superstep."""

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        journal = active()
        recorded = journal.recorded_response()
        if recorded is not None:
            return recorded
        await journal._claim_step()
        recoveries: list[str] = []
        channel, index = journal.channel, len(journal.responses)
        relay = None
        if channel is not None:
            channel.restart(index)

            def relay(event: Any) -> None:
                channel.event(index, event)

        try:
            with journal.node.waiting():
                if journal.stream_policy is not None and _streams(self.wrapped):
                    response, recoveries = await streamed_step(
                        journal.node,
                        self.wrapped,
                        messages,
                        model_settings,
                        model_request_parameters,
                        journal.stream_policy,
                        relay,
                    )
                else:
                    response = await self.wrapped.request(
                        messages, model_settings, model_request_parameters
                    )
        except BaseException:
            journal._abort_step()
            raise
        return await journal.record_response(response, recoveries, messages)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """A recorded response streams its parts again (``run_stream`` and ``iter`` over a
        recorded run); a new one is drained from the wrapped model's stream, recorded whole,
        and ends the superstep."""
        journal = active()
        recorded = journal.recorded_response()
        if recorded is None:
            await journal._claim_step()
            try:
                with journal.node.waiting():
                    async with self.wrapped.request_stream(
                        messages, model_settings, model_request_parameters, run_context
                    ) as stream:
                        async for _ in stream:
                            pass
                        response = stream.get()
            except BaseException:
                journal._abort_step()
                raise
            recorded = await journal.record_response(response, None, messages)
        yield CompletedStreamedResponse(
            recorded, model_request_parameters=model_request_parameters, replay_events=True
        )


def _streams(model: Model) -> bool:
    """Whether the model can stream (a ``FunctionModel`` needs a ``stream_function``)."""
    return not isinstance(model, FunctionModel) or model.stream_function is not None


@dataclass
class JournalToolset(WrapperToolset[Any]):
    """A toolset whose calls are journal steps under wakeful's replay policies."""

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        journal = active()
        call_id = ctx.tool_call_id or f"{name}-{ctx.run_step}"

        async def run() -> Any:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)

        return await journal.call_tool(name, call_id, run)


def journal_toolset(toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
    return toolset.visit_and_replace(lambda leaf: JournalToolset(leaf))


__all__ = [
    "INDETERMINATE",
    "REPLAY_POLICIES",
    "Journal",
    "JournalModel",
    "JournalToolset",
    "StepTaken",
    "dump_response",
    "idempotency_key",
    "journal_toolset",
]
