"""Stream recovery: one complete assistant turn out of an unreliable model stream.

Before any output, eligible failures are retried with exponential backoff and jitter
(honouring the provider's hint, capped at 60 s) up to a budget; permanent errors are not
retried. After partial output the plan depends on what arrived:

- R1, text only: continue with a continuation request (its extra messages are never
  committed); the continuation's text is appended to what arrived.
- R2, at least one complete tool call: the complete calls are the turn; a partial one is
  dropped.
- R3, text and an unfinished call: drop the call and continue as in R1.
- R4, nothing usable: restart the request.

An idle stream (no item for ``idle_timeout``) is an interruption. While streaming, the
unfinished turn is saved as a stream checkpoint at a bounded rate and at every interruption,
so a replacement process continues from it through the same plan. A checkpoint failure is
logged and counted, never fails the turn.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from wakeful.providers.base import (
    MAX_RETRY_AFTER,
    ModelRequest,
    Provider,
    ProviderError,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from wakeful.records import Message, StreamCheckpoint
from wakeful.store.contract import StreamCheckpointStore

log = logging.getLogger("wakeful.agent")

Sleep = Callable[[float], Awaitable[None]]
Live = Callable[[str, Any], None]

CONTINUATION_PROMPT = (
    "Your previous reply was cut off. Continue it exactly where it stopped, without "
    "repeating anything already written."
)


@dataclass(frozen=True)
class StreamPolicy:
    """How a model turn is retried and checkpointed."""

    max_retries: int = 4
    """Failures and interruptions tolerated per turn before the error is raised."""
    initial_backoff: float = 0.5
    max_backoff: float = 30.0
    jitter: float = 0.25
    """Backoff is multiplied by a random factor in [1 - jitter, 1 + jitter]."""
    idle_timeout: float = 60.0
    checkpoint_every_deltas: int = 32
    checkpoint_every_seconds: float = 0.5
    checkpoint_min_interval: float = 0.05
    """Seconds at least between two checkpoints: bounds their cost when deltas arrive
    faster than a checkpoint can be written (a crash then loses at most this much)."""
    checkpoints: bool = True
    """Write stream checkpoints (when the store has them)."""
    continuation_prompt: str = CONTINUATION_PROMPT

    def backoff(self, attempt: int, hint: float | None) -> float:
        if hint is not None:
            return min(hint, MAX_RETRY_AFTER)
        base = min(self.initial_backoff * 2 ** (attempt - 1), self.max_backoff)
        return float(base * random.uniform(1 - self.jitter, 1 + self.jitter))


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """A complete assistant turn. ``tool_calls`` are ``{"id", "name", "arguments"}``."""

    text: str
    tool_calls: list[dict[str, Any]]
    stop_reason: str
    usage: Usage | None = None
    recoveries: list[str] = msgspec.field(default_factory=list)
    """The plans used to get here (``"retry"``, ``"R1"`` ... ``"R4"``, ``"resumed"``)."""


@dataclass
class Accumulator:
    text: str = ""
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    offset: int = 0
    """Tool-call indices of a continuation start after the calls already kept."""

    def feed(self, item: TextDelta | ToolCallDelta) -> None:
        if isinstance(item, TextDelta):
            self.text += item.text
            return
        index = self.offset + item.index
        call = self.calls.setdefault(index, {"id": None, "name": None, "arguments": ""})
        if item.id is not None:
            call["id"] = item.id
        if item.name is not None:
            call["name"] = item.name
        call["arguments"] += item.arguments

    def complete(self) -> list[dict[str, Any]]:
        """Calls with an id, a name and arguments that parse as a complete JSON object."""
        return [dict(c) for _, c in sorted(self.calls.items()) if _is_complete(c)]

    def unfinished(self) -> dict[str, Any] | None:
        rest = [dict(c) for _, c in sorted(self.calls.items()) if not _is_complete(c)]
        return rest[-1] if rest else None

    def keep_complete_only(self) -> None:
        kept = self.complete()
        self.calls = dict(enumerate(kept))
        self.offset = len(kept)

    def empty(self) -> bool:
        return not self.text and not self.calls


def _is_complete(call: dict[str, Any]) -> bool:
    if not call.get("id") or not call.get("name"):
        return False
    try:
        return isinstance(msgspec.json.decode(call["arguments"] or "{}"), dict)
    except msgspec.DecodeError:
        return False


def plan_for(acc: Accumulator) -> str:
    if acc.complete():
        return "R2"
    if acc.text and acc.unfinished() is not None:
        return "R3"
    if acc.text:
        return "R1"
    return "R4"


@dataclass
class StreamRecovery:
    """Streams one turn of ``provider`` for one task of a run, with checkpoints."""

    provider: Provider
    policy: StreamPolicy
    run_id: str
    thread_id: str
    task_id: str
    token: int
    checkpoints: StreamCheckpointStore | None = None
    sleep: Sleep = asyncio.sleep
    live: Live | None = None
    counters: dict[str, int] = field(default_factory=dict)
    on_checkpoint_failure: Callable[[], None] | None = None
    message_id: str | None = None
    """The id the committed assistant message will have; live deltas and checkpoints name
    the turn by it."""
    _saving: asyncio.Task[None] | None = field(default=None, init=False)
    _next_save: StreamCheckpoint | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not self.policy.checkpoints:
            self.checkpoints = None

    async def turn(self, request: ModelRequest) -> Turn:
        """One complete turn (see the module docstring). Every checkpoint write has landed
        when this returns, so ``discard`` cannot be overtaken by a late write."""
        try:
            return await self._turn(request)
        finally:
            await self._drain_saves()

    async def _turn(self, request: ModelRequest) -> Turn:
        acc = Accumulator()
        attempts = 0
        recoveries: list[str] = []
        current = request
        saved = await self._load()
        if saved is not None:
            acc.text = saved.partial_text
            acc.calls = dict(enumerate(saved.tool_calls))
            if saved.in_flight_tool is not None:
                acc.calls[len(acc.calls)] = dict(saved.in_flight_tool)
            attempts = saved.retry_count
            recoveries.append("resumed")
            plan = plan_for(acc)
            recoveries.append(plan)
            if plan == "R2":
                return self._finish(acc, "tool_use", None, recoveries, complete_only=True)
            current = self._after_interruption(plan, acc, request)
        while True:
            try:
                end = await self._consume(current, acc, attempts)
                return self._finish(acc, end.stop_reason, end.usage, recoveries)
            except ProviderError as error:
                if not error.retryable:
                    raise
                attempts += 1
                if attempts > self.policy.max_retries:
                    raise
                await self._drain_saves()
                await self._save(acc, attempts, force=True)
                plan = plan_for(acc)
                recoveries.append(plan if not acc.empty() else "retry")
                self._emit("stream.interrupted", {"kind": error.kind, "plan": plan})
                if plan == "R2":
                    return self._finish(acc, "tool_use", None, recoveries, complete_only=True)
                await self.sleep(self.policy.backoff(attempts, error.retry_after))
                current = self._after_interruption(plan, acc, request)

    def _after_interruption(
        self, plan: str, acc: Accumulator, request: ModelRequest
    ) -> ModelRequest:
        if plan in ("R1", "R3"):
            acc.keep_complete_only()
            return self._continuation(request, acc.text)
        acc.text, acc.calls, acc.offset = "", {}, 0
        return request

    def _continuation(self, request: ModelRequest, partial: str) -> ModelRequest:
        """The request plus the partial reply and a prompt to continue it. These two
        messages exist only in this request; the thread never records them."""
        extra = (
            Message(id="continuation-partial", role="assistant", content=partial),
            Message(id="continuation-prompt", role="user", content=self.policy.continuation_prompt),
        )
        return msgspec.structs.replace(request, messages=(*request.messages, *extra))

    async def _consume(self, request: ModelRequest, acc: Accumulator, attempts: int) -> StreamEnd:
        since_save = 0
        last_save = time.monotonic()
        stream = self.provider.stream(request)
        guarded = _idle_guard(stream, self.policy.idle_timeout)
        self._emit_start(acc)
        try:
            async for item in guarded:
                if isinstance(item, StreamEnd):
                    return item
                self._emit_delta(acc, item)
                acc.feed(item)
                since_save += 1
                now = time.monotonic()
                elapsed = now - last_save
                if elapsed >= self.policy.checkpoint_min_interval and (
                    since_save >= self.policy.checkpoint_every_deltas
                    or elapsed >= self.policy.checkpoint_every_seconds
                ):
                    self._save_in_background(acc, attempts)
                    since_save, last_save = 0, now
        finally:
            await guarded.aclose()
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        raise ProviderError("connection", "the stream ended before the turn was complete")

    def _emit_start(self, acc: Accumulator) -> None:
        """Where this attempt's deltas start: the text kept so far (``offset`` characters)
        and the complete calls kept (``tool_calls``); anything a listener holds beyond them
        was discarded (a restart, or a replacement process resuming from a checkpoint)."""
        if self.live is not None:
            self.live(
                "message.started",
                {
                    "message_id": self.message_id,
                    "task_id": self.task_id,
                    "token": self.token,
                    "offset": len(acc.text),
                    "tool_calls": len(acc.calls),
                },
            )

    def _emit_delta(self, acc: Accumulator, item: TextDelta | ToolCallDelta) -> None:
        """A live delta with its position in the turn (so a listener can place it)."""
        if self.live is None:
            return
        if isinstance(item, TextDelta):
            data = {"text": item.text, "offset": len(acc.text)}
            self.live("text.delta", {**data, "message_id": self.message_id, "token": self.token})
            return
        index = acc.offset + item.index
        call = acc.calls.get(index)
        self.live(
            "tool_call.delta",
            {
                "index": index,
                "id": item.id,
                "name": item.name,
                "arguments": item.arguments,
                "offset": len(call["arguments"]) if call is not None else 0,
                "message_id": self.message_id,
                "token": self.token,
            },
        )

    def _finish(
        self,
        acc: Accumulator,
        stop_reason: str,
        usage: Usage | None,
        recoveries: list[str],
        *,
        complete_only: bool = False,
    ) -> Turn:
        return Turn(
            text=acc.text,
            tool_calls=acc.complete() if complete_only else self._all(acc),
            stop_reason=stop_reason,
            usage=usage,
            recoveries=recoveries,
        )

    @staticmethod
    def _all(acc: Accumulator) -> list[dict[str, Any]]:
        """Every call of a normally finished turn, complete or not: an invalid one gets an
        error result instead of running (the model sees why)."""
        return [dict(c) for _, c in sorted(acc.calls.items()) if c.get("id") and c.get("name")]

    # ------------------------------------------------------------ checkpoints

    async def _load(self) -> StreamCheckpoint | None:
        if self.checkpoints is None:
            return None
        try:
            saved = await self.checkpoints.get(self.run_id)
        except Exception as exc:
            self._checkpoint_failed(exc)
            return None
        if saved is None or saved.task_id != self.task_id:
            return None
        return saved

    def _save_in_background(self, acc: Accumulator, attempts: int) -> None:
        """Save without making the stream wait: one write in flight at a time, and while it
        runs only the newest snapshot waits its turn."""
        if self.checkpoints is None or acc.empty():
            return
        snapshot = self._snapshot(acc, attempts)
        if self._saving is not None and not self._saving.done():
            self._next_save = snapshot
            return
        self._saving = asyncio.create_task(self._save_chain(snapshot))

    async def _save_chain(self, snapshot: StreamCheckpoint | None) -> None:
        while snapshot is not None:
            await self._put(snapshot)
            snapshot, self._next_save = self._next_save, None

    async def _drain_saves(self) -> None:
        if self._saving is not None:
            await self._saving
            self._saving = None

    async def _save(self, acc: Accumulator, attempts: int, *, force: bool = False) -> None:
        if self.checkpoints is None or (acc.empty() and not force):
            return
        await self._put(self._snapshot(acc, attempts))

    def _snapshot(self, acc: Accumulator, attempts: int) -> StreamCheckpoint:
        return StreamCheckpoint(
            run_id=self.run_id,
            thread_id=self.thread_id,
            model=getattr(self.provider, "model", type(self.provider).__name__),
            partial_text=acc.text,
            tool_calls=acc.complete(),
            in_flight_tool=acc.unfinished(),
            retry_count=attempts,
            token=self.token,
            task_id=self.task_id,
            message_id=self.message_id,
        )

    async def _put(self, checkpoint: StreamCheckpoint) -> None:
        if self.checkpoints is None:
            return
        try:
            await self.checkpoints.put(checkpoint)
            self.counters["checkpoints"] = self.counters.get("checkpoints", 0) + 1
        except Exception as exc:
            self._checkpoint_failed(exc)

    async def discard(self) -> None:
        """Delete the run's checkpoint (after the turn is committed); failures are counted."""
        if self.checkpoints is None:
            return
        try:
            saved = await self.checkpoints.get(self.run_id)
            if saved is None or saved.task_id == self.task_id:
                await self.checkpoints.delete(self.run_id)
        except Exception as exc:
            self._checkpoint_failed(exc)

    def _checkpoint_failed(self, exc: BaseException) -> None:
        self.counters["checkpoint_failures"] = self.counters.get("checkpoint_failures", 0) + 1
        if self.on_checkpoint_failure is not None:
            self.on_checkpoint_failure()
        log.warning("stream checkpoint of run %s failed (the turn goes on): %s", self.run_id, exc)
        self._emit("stream.checkpoint_failed", {"error": str(exc)})

    def _emit(self, type: str, data: Any) -> None:
        if self.live is not None:
            self.live(type, data)


async def _idle_guard(
    stream: AsyncIterator[StreamItem], idle: float
) -> AsyncGenerator[StreamItem, None]:
    """Re-yield ``stream``'s items; no item for ``idle`` seconds is a timeout."""
    iterator = aiter(stream)
    while True:
        try:
            item = await asyncio.wait_for(anext(iterator), idle)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ProviderError("timeout", f"no delta for {idle:g} s") from None
        yield item
