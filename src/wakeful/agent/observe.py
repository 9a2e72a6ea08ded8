"""What an agent records about model turns and tool calls: spans with the OpenTelemetry
GenAI conventions and the model and tool metrics.

A model turn is one ``chat {model}`` client span (``gen_ai.operation.name``,
``gen_ai.request.model``, usage tokens, finish reasons) whose events are the time to first
token of each attempt, each retried failure and each recovery plan (R1-R4). Prompt and
completion text go on it only with ``telemetry.capture_content()`` (an explicit opt-in);
request headers and credentials never do. A tool call is one ``execute_tool {name}`` span
with its replay policy, idempotency key and whether it ran, was replayed after a recovery,
or was not run again (``indeterminate``)."""

from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from wakeful import telemetry
from wakeful.providers.base import ModelRequest, ProviderError, StreamEnd
from wakeful.telemetry import NO_SPAN, SpanLike

if TYPE_CHECKING:
    from wakeful.agent.recovery import Turn
    from wakeful.metrics import Metrics

_PROVIDERS = {"OpenAIChat": "openai", "AnthropicMessages": "anthropic", "Scripted": "scripted"}


def provider_name(provider: object) -> str:
    """``gen_ai.provider.name`` of an adapter (its class name for one wakeful does not ship)."""
    name = type(provider).__name__
    return _PROVIDERS.get(name, name.lower())


def _messages(request: ModelRequest) -> str:
    return msgspec.json.encode(
        [
            {"role": m.role, "content": m.content, "tool_calls": m.tool_calls}
            for m in request.messages
        ]
    ).decode()


class TurnObserver:
    """The span and metrics of one model turn (a ``with`` block around it)."""

    def __init__(
        self, request: ModelRequest | None, provider: object, metrics: Metrics | None
    ) -> None:
        """``request=None``: an observer that records nothing (before a turn starts)."""
        self.model = request.model if request is not None else ""
        self.metrics = metrics
        self.span: SpanLike = NO_SPAN
        self._request = request
        self._provider = provider
        self._attempt = 0
        self._sent = 0.0
        self._first: float | None = None

    def __enter__(self) -> TurnObserver:
        request = self._request
        if request is None or telemetry.tracer() is None:
            return self
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": request.model,
            "gen_ai.provider.name": provider_name(self._provider),
            "gen_ai.request.max_tokens": request.max_tokens,
        }
        if request.temperature is not None:
            attributes["gen_ai.request.temperature"] = request.temperature
        if telemetry.capture_content():
            attributes["gen_ai.input.messages"] = _messages(request)
            if request.system:
                attributes["gen_ai.system_instructions"] = request.system
        self.span = telemetry.start(
            f"chat {request.model}", attributes, kind=telemetry.kind("client")
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.span.set_attribute("wakeful.model.attempts", self._attempt)
        telemetry.finish(self.span, exc)

    def attempt(self) -> None:
        """A request is being sent (the first, a retry or a continuation)."""
        self._attempt += 1
        self._sent = time.perf_counter()
        self._first = None

    def delta(self) -> None:
        """A delta arrived; the first of an attempt is its time to first token."""
        if self._first is not None:
            return
        self._first = time.perf_counter()
        waited = self._first - self._sent
        if self.metrics is not None:
            self.metrics.first_token.observe(waited, model=self.model)
        self.span.add_event(
            "gen_ai.first_token",
            {"wakeful.model.attempt": self._attempt, "gen_ai.time_to_first_token": waited},
        )

    def ended(self, end: StreamEnd) -> None:
        """An attempt finished normally: output tokens per second, if usage says."""
        usage = end.usage
        if self.metrics is None or usage is None or self._first is None:
            return
        took = time.perf_counter() - self._first
        if usage.output_tokens > 0 and took > 0:
            self.metrics.token_rate.observe(usage.output_tokens / took, model=self.model)

    def failed(self, error: ProviderError, plan: str) -> None:
        """A retryable failure; ``plan`` is how the turn goes on."""
        if self.metrics is not None:
            self.metrics.model_retries.inc(model=self.model, kind=error.kind)
        self.span.add_event(
            "wakeful.model.retry",
            {
                "error.type": error.kind,
                "wakeful.model.attempt": self._attempt,
                "wakeful.stream.plan": plan,
                **({"http.response.status_code": error.status} if error.status else {}),
            },
        )

    def recovered(self, plan: str) -> None:
        """A recovery plan was used (``retry``, ``R1``-``R4``, ``resumed``)."""
        if self.metrics is not None:
            self.metrics.recoveries.inc(kind=plan)
        self.span.add_event("wakeful.stream.recovery", {"wakeful.stream.plan": plan})

    def finished(self, turn: Turn) -> None:
        span = self.span
        if span is NO_SPAN:
            return
        span.set_attribute("gen_ai.response.finish_reasons", [turn.stop_reason])
        if turn.usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", turn.usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", turn.usage.output_tokens)
        if turn.recoveries:
            span.set_attribute("wakeful.stream.recoveries", list(turn.recoveries))
        span.set_attribute("wakeful.model.tool_calls", len(turn.tool_calls))
        if telemetry.capture_content():
            out = {"role": "assistant", "content": turn.text, "tool_calls": turn.tool_calls}
            span.set_attribute("gen_ai.output.messages", msgspec.json.encode([out]).decode())


class ToolObserver:
    """The span and duration of one tool call; ``execution`` is ``run``, ``replayed`` (it
    runs again after its run was recovered at this step) or ``indeterminate``."""

    def __init__(
        self,
        name: str,
        call_id: str,
        replay: str,
        idempotency_key: str,
        metrics: Metrics | None,
    ) -> None:
        self.name = name
        self.metrics = metrics
        self._started = time.perf_counter()
        self.span = telemetry.start(
            f"execute_tool {name}",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "wakeful.tool.replay": replay,
                "wakeful.tool.idempotency_key": idempotency_key,
            },
        )

    def run(self, execution: str) -> Any:
        """The span made current while the tool runs."""
        self.span.set_attribute("wakeful.tool.execution", execution)
        return telemetry.use(self.span)

    def done(self, outcome: str, ran: bool, error: BaseException | None = None) -> None:
        self.span.set_attribute("wakeful.tool.outcome", outcome)
        if ran and self.metrics is not None:
            took = time.perf_counter() - self._started
            self.metrics.tool_seconds.observe(took, tool=self.name, outcome=outcome)
        telemetry.finish(self.span, error)
