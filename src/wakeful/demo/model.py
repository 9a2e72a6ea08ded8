"""The demo's model: a deterministic provider that answers from the request alone, so any
process (the first worker or its replacement) gives the same answers.

- After the user's question it calls the ``lookup_order`` tool.
- After the tool result it streams ``ANSWER`` slowly, a few characters at a time.
- Asked to continue a cut-off reply, it streams the rest of ``ANSWER`` after the prefix it
  was given."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from wakeful.agent.recovery import CONTINUATION_PROMPT
from wakeful.providers.base import (
    ModelRequest,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    Usage,
)

ANSWER = (
    "Order 42 shipped on Monday from the Rotterdam warehouse and is with the carrier now. "
    "It should reach you by Thursday; the tracking link is in your confirmation email. "
    "If it has not arrived by Friday, reply here and I will open a claim with the carrier "
    "and send a replacement the same day."
)


class DemoModel:
    model = "demo-model"

    def __init__(self, delay: float = 0.03, chunk: int = 6) -> None:
        self.delay = delay
        self.chunk = chunk

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._reply(request)

    async def _reply(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "user" and last.content == CONTINUATION_PROMPT:
            partial = str(request.messages[-2].content or "")
            rest = ANSWER[len(partial) :] if ANSWER.startswith(partial) else ANSWER
            async for item in self._text(rest):
                yield item
            return
        if last is not None and last.role == "tool":
            async for item in self._text(ANSWER):
                yield item
            return
        yield ToolCallDelta(index=0, id="call-lookup-1", name="lookup_order", arguments='{"order_')
        yield ToolCallDelta(index=0, arguments='id": 42}')
        yield StreamEnd("tool_use", Usage(40, 12))

    async def _text(self, text: str) -> AsyncIterator[StreamItem]:
        for i in range(0, len(text), self.chunk):
            await asyncio.sleep(self.delay)
            yield TextDelta(text[i : i + self.chunk])
        yield StreamEnd("end_turn", Usage(60, len(text) // 4))
