"""``Scripted``: a deterministic provider for tests and demos that can inject every failure.

Each call to ``stream`` plays the next scripted turn. A turn is a list of steps: stream
items (``TextDelta``, ``ToolCallDelta``, ``StreamEnd``) and controls: ``Fail`` raises a
``ProviderError`` at that point (before any output, it is a failed request), ``Drop`` ends
the stream without its end marker (a dropped connection), ``Stall`` stops sending until the
consumer gives up (an idle stream). Build turns with ``Scripted.reply``, ``Scripted.calls``,
``Scripted.text`` and ``Scripted.tool_call`` (also module functions)::

    model = Scripted.of(
        Scripted.calls(("c1", "lookup", {"order": 42})),   # turn 1: one tool call
        [*Scripted.text("Your ord"), Drop()],              # turn 2: drops mid-reply (R1)
        Scripted.reply("Your order shipped."),             # turn 3: the continuation
    )
    # or, for plain text replies: Scripted.replies("Hello!", "Anything else?")
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from wakeful.providers.base import (
    ErrorKind,
    ModelRequest,
    ProviderError,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    Usage,
)


@dataclass(frozen=True)
class Fail:
    kind: ErrorKind = "server"
    retry_after: float | None = None
    status: int | None = None


@dataclass(frozen=True)
class Drop:
    """The connection drops here."""


@dataclass(frozen=True)
class Stall:
    """No more deltas arrive (until ``seconds`` have passed, default: never)."""

    seconds: float | None = None


Step = TextDelta | ToolCallDelta | StreamEnd | Fail | Drop | Stall


def text(content: str, *, chunk: int = 4) -> list[Step]:
    """``content`` as text deltas of ``chunk`` characters."""
    return [TextDelta(content[i : i + chunk]) for i in range(0, len(content), chunk)]


def tool_call(index: int, call_id: str, name: str, arguments: Any, *, chunk: int = 8) -> list[Step]:
    """One tool call streamed in argument fragments of ``chunk`` characters."""
    raw = arguments if isinstance(arguments, str) else msgspec.json.encode(arguments).decode()
    pieces = [raw[i : i + chunk] for i in range(0, len(raw), chunk)] or [""]
    first = ToolCallDelta(index=index, id=call_id, name=name, arguments=pieces[0])
    return [first, *(ToolCallDelta(index=index, arguments=p) for p in pieces[1:])]


def reply(content: str, *, chunk: int = 4) -> list[Step]:
    """A complete text turn."""
    return [*text(content, chunk=chunk), StreamEnd("end_turn", Usage(10, len(content)))]


def calls(*specs: tuple[str, str, Any], preface: str = "") -> list[Step]:
    """A complete turn of tool calls ``(id, name, arguments)``, optionally after text."""
    steps: list[Step] = text(preface) if preface else []
    for index, (call_id, name, arguments) in enumerate(specs):
        steps += tool_call(index, call_id, name, arguments)
    return [*steps, StreamEnd("tool_use", Usage(10, 5))]


@dataclass
class Scripted:
    """Plays ``turns`` in order, one per ``stream`` call; records every request. When the
    script runs out, further calls fail with ``invalid_request`` (a test bug, not a retry).
    ``delay`` seconds pass between items (0: none)."""

    turns: list[list[Step]]
    model: str = "scripted"
    delay: float = 0.0
    requests: list[ModelRequest] = field(default_factory=list)

    @classmethod
    def of(cls, *turns: Iterable[Step], **options: Any) -> Scripted:
        """One turn per argument, each a list of steps."""
        return cls([list(t) for t in turns], **options)

    @classmethod
    def replies(cls, *answers: str, **options: Any) -> Scripted:
        """One complete text turn per answer."""
        return cls([reply(answer) for answer in answers], **options)

    text = staticmethod(text)
    tool_call = staticmethod(tool_call)
    reply = staticmethod(reply)
    calls = staticmethod(calls)

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        self.requests.append(request)
        if not self.turns:
            return _fail(
                ProviderError("invalid_request", "the scripted provider has no more turns")
            )
        return self._play(self.turns.pop(0))

    async def _play(self, steps: list[Step]) -> AsyncIterator[StreamItem]:
        for step in steps:
            if isinstance(step, Fail):
                raise ProviderError(
                    step.kind, "scripted failure", retry_after=step.retry_after, status=step.status
                )
            if isinstance(step, Drop):
                return
            if isinstance(step, Stall):
                if step.seconds is None:
                    await asyncio.Event().wait()
                else:
                    await asyncio.sleep(step.seconds)
                continue
            if self.delay:
                await asyncio.sleep(self.delay)
            yield step


async def _fail(error: ProviderError) -> AsyncIterator[StreamItem]:
    nothing: tuple[StreamItem, ...] = ()
    for item in nothing:  # an async generator that raises when first iterated
        yield item
    raise error
