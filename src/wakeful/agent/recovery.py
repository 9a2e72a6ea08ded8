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
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from wakeful.agent.observe import TurnObserver
from wakeful.agent.saves import Saves
from wakeful.backoff import backoff_delay
from wakeful.providers.base import (
    MAX_RETRY_AFTER,
    ModelRequest,
    Provider,
    ProviderError,
    StreamEnd,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from wakeful.records import Message, StreamCheckpoint
from wakeful.store.contract import StreamCheckpointStore
from wakeful.store.validate import discards

if TYPE_CHECKING:
    from wakeful.agent.limiting import CallLimits
    from wakeful.metrics import Metrics

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
        return backoff_delay(attempt, self.initial_backoff, self.max_backoff, jitter=self.jitter)


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """A complete assistant turn. ``tool_calls`` are ``{"id", "name", "arguments"}``."""

    text: str
    tool_calls: list[dict[str, Any]]
    stop_reason: str
    usage: Usage | None = None
    recoveries: list[str] = msgspec.field(default_factory=list)
    """The plans used to get here (``"retry"``, ``"R1"`` ... ``"R4"``, ``"resumed"``)."""


@dataclass(slots=True)
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


PLANS = {
    "retry": "nothing arrived yet, the request is sent again",
    "R1": "text only, continue it with a continuation request",
    "R2": "complete tool calls, keep them as the turn and drop the partial one",
    "R3": "text and an unfinished tool call, drop the call and continue the text",
    "R4": "nothing usable, restart the request",
}


def plan_for(acc: Accumulator) -> str:
    if acc.complete():
        return "R2"
    if acc.text and acc.unfinished() is not None:
        return "R3"
    if acc.text:
        return "R1"
    return "R4"


@dataclass(slots=True)  # an 830-byte dict per streaming run otherwise
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
    waiting: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
    """Marks the run as known to be waiting (``NodeContext.waiting``) while the model
    streams (its silence is bounded by ``idle_timeout``) and during a backoff sleep."""
    _saves: Saves | None = field(default=None, init=False)
    metrics: Metrics | None = None
    """Where the model metrics go (time to first token, tokens/s, retries, recoveries)."""
    _seen: TurnObserver = field(init=False)
    message_id: str | None = None
    """The id the committed assistant message will have; live deltas and checkpoints name
    the turn by it."""
    live_wanted: Callable[[str], bool] | None = None
    """Whether a live event of a type would reach anybody now (``NodeContext.wants_live``):
    deltas nobody would receive are not built. ``None``: always build them."""
    limits: CallLimits | None = None
    """The rate limits each call of the turn takes from before it is sent (``limiting``)."""
    resume: bool = True
    """Look for a stream checkpoint to resume from at the turn's start. ``False`` for a
    turn no earlier attempt can have started (``NodeContext.fresh``): it has none, and the
    read is saved."""

    def __post_init__(self) -> None:
        self._seen = TurnObserver(None, self.provider, None)
        if not self.policy.checkpoints:
            self.checkpoints = None

    async def turn(self, request: ModelRequest) -> Turn:
        """One complete turn (see the module docstring). Every checkpoint write has landed
        when this returns, so ``discard`` cannot be overtaken by a late write (unless a write
        hung past ``wakeful.background.STOP_TIMEOUT`` twice and was abandoned, which is
        logged). Observed as one ``chat`` span (see ``agent.observe``)."""
        with TurnObserver(request, self.provider, self.metrics) as seen:
            self._seen = seen
            try:
                turn = await self._turn(request)
            finally:
                await self._drain_saves()
            seen.finished(turn)
            return turn

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
            self._recovered(recoveries, "resumed")
            plan = plan_for(acc)
            self._recovered(recoveries, plan)
            self._log_recovery(plan, "resumed from the stream checkpoint of an interrupted turn")
            if plan == "R2":
                return self._finish(acc, "tool_use", None, recoveries, complete_only=True)
            current = self._after_interruption(plan, acc, request)
        gate = self.limits
        while True:
            try:
                with self.waiting():
                    estimate = 0 if gate is None else await gate.acquire(current)
                    end = await self._consume(current, acc, attempts)
                if gate is not None:
                    await gate.settle(estimate, end.usage, end.limit_reset)
                return self._finish(acc, end.stop_reason, end.usage, recoveries)
            except ProviderError as error:
                if gate is not None:
                    await gate.refused(error)
                if not error.retryable:
                    raise
                attempts += 1
                if attempts > self.policy.max_retries:
                    raise
                await self._drain_saves()
                await self._save(acc, attempts, force=True)
                plan = plan_for(acc)
                self._seen.failed(error, plan)
                self._recovered(recoveries, plan if not acc.empty() else "retry")
                self._emit("stream.interrupted", {"kind": error.kind, "plan": plan})
                self._log_recovery(
                    plan if not acc.empty() else "retry",
                    f"{error.kind} error, attempt {attempts} of {self.policy.max_retries}: {error}",
                )
                if plan == "R2":
                    return self._finish(acc, "tool_use", None, recoveries, complete_only=True)
                with self.waiting():
                    await self.sleep(self.policy.backoff(attempts, error.retry_after))
                current = self._after_interruption(plan, acc, request)

    def _log_recovery(self, plan: str, why: str) -> None:
        log.warning(
            "run %s: model stream interrupted (%s); recovering with %s: %s",
            self.run_id,
            why,
            plan,
            PLANS.get(plan, plan),
            extra={"run_id": self.run_id, "thread_id": self.thread_id, "plan": plan, "reason": why},
        )

    def _recovered(self, recoveries: list[str], plan: str) -> None:
        recoveries.append(plan)
        self._seen.recovered(plan)

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
        self._seen.attempt()
        stream = self.provider.stream(request)
        # the idle guard inline: an async generator around the stream would cost one more
        # resumption per delta
        following = aiter(stream).__anext__
        timer = _IdleTimer(self.policy.idle_timeout)
        self._emit_start(acc)
        # per delta, the work is kept to locals and one clock read (it runs 150,000 times
        # for a worker's thousand streams)
        clock, idle = timer.clock, timer.idle
        policy = self.policy
        min_interval = policy.checkpoint_min_interval
        every_deltas, every_seconds = (
            policy.checkpoint_every_deltas,
            policy.checkpoint_every_seconds,
        )
        live, wanted = self.live, self.live_wanted
        since_save, first = 0, True
        now = last_save = clock()
        try:
            while True:
                # the consumer starts waiting for the next item: the idle deadline moves
                timer.deadline, timer.waiting = now + idle, True
                try:
                    item = await following()
                except StopAsyncIteration:
                    break
                except asyncio.CancelledError:
                    timer.raise_if_fired()
                    raise
                finally:
                    timer.waiting = False
                if isinstance(item, StreamEnd):
                    self._seen.ended(item)
                    return item
                if first:
                    self._seen.delta()
                    first = False
                if isinstance(item, TextDelta):
                    if live is not None and (wanted is None or wanted("text.delta")):
                        self._emit_text(acc, item.text)
                    acc.text += item.text
                else:
                    self._emit_call(acc, item)
                    acc.feed(item)
                since_save += 1
                now = clock()
                elapsed = now - last_save
                if elapsed >= min_interval and (
                    since_save >= every_deltas or elapsed >= every_seconds
                ):
                    self._save_in_background(acc, attempts)
                    since_save, last_save = 0, now
        finally:
            timer.close()
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

    def _emit_text(self, acc: Accumulator, text: str) -> None:
        """A live text delta with its position in the turn (so a listener can place it)."""
        assert self.live is not None
        self.live(
            "text.delta",
            {
                "text": text,
                "offset": len(acc.text),
                "message_id": self.message_id,
                "token": self.token,
            },
        )

    def _emit_call(self, acc: Accumulator, item: ToolCallDelta) -> None:
        """A live tool-call delta with its position in the turn."""
        if self.live is None:
            return
        if self.live_wanted is not None and not self.live_wanted("tool_call.delta"):
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
        if self.checkpoints is None or not self.resume:
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
        runs only the newest snapshot waits its turn (``agent.saves``: no task per turn)."""
        if self.checkpoints is None or acc.empty():
            return
        if self._saves is None:
            self._saves = Saves(
                self.checkpoints,
                f"stream-checkpoint:{self.run_id}",
                self._saved,
                self._checkpoint_failed,
                log,
            )
        self._saves.save(self._snapshot(acc, attempts))

    async def _drain_saves(self) -> None:
        """End the background writes once what is queued has landed (bounded: see
        ``agent.saves``)."""
        if self._saves is not None:
            await self._saves.drain()

    def _saved(self) -> None:
        self.counters["checkpoints"] = self.counters.get("checkpoints", 0) + 1

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
            tool_calls=acc.complete() if acc.calls else [],
            in_flight_tool=acc.unfinished() if acc.calls else None,
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
            self._saved()
        except Exception as exc:
            self._checkpoint_failed(exc)

    async def discard(self) -> None:
        """Delete the run's checkpoint of this turn (after the turn is committed), in one
        conditional write (``StreamCheckpointStore.discard``): a checkpoint of another turn,
        or one a newer attempt wrote, stays. Failures are counted."""
        if self.checkpoints is None:
            return
        try:
            discard = getattr(self.checkpoints, "discard", None)
            if discard is not None:
                await discard(self.run_id, self.task_id, self.token)
                return
            # a store written before ``discard`` was in the contract: read, then delete
            saved = await self.checkpoints.get(self.run_id)
            if discards(saved, self.task_id, self.token):
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


class _IdleTimer:
    """One timer per stream, the idle guard of ``_consume``: it fires at most once per
    ``idle`` seconds and cancels the consuming task only while that task waits for the next
    item past its deadline (a task per item, as ``asyncio.wait_for`` makes on Python 3.11,
    cost about 28 µs a delta)."""

    __slots__ = ("_handle", "_loop", "_task", "deadline", "fired", "idle", "waiting")

    def __init__(self, idle: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.idle = idle
        self.deadline = self._loop.time() + idle
        self.waiting = False
        self.fired = False
        self._handle = self._loop.call_at(self.deadline, self._check)

    @property
    def clock(self) -> Callable[[], float]:
        """The clock the deadline is on (the event loop's)."""
        return self._loop.time

    def _check(self) -> None:
        now = self._loop.time()
        if self.waiting and now >= self.deadline:
            self.fired = True
            self._task.cancel()
            return
        self._handle = self._loop.call_at(max(self.deadline, now + self.idle), self._check)

    def raise_if_fired(self) -> None:
        """On a ``CancelledError`` while waiting: raise the timeout instead if the
        cancellation was the timer's (and nobody else's too)."""
        if self.fired and self._task.uncancel() == 0:
            raise ProviderError("timeout", f"no delta for {self.idle:g} s") from None

    def close(self) -> None:
        self._handle.cancel()
