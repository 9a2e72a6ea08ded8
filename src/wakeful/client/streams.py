"""Streams of the HTTP API as async iterators that reconnect by themselves.

``Stream`` reads Server-Sent Events with the decoder the providers use
(``wakeful.providers.sse``). When the connection drops or the server ends the stream before
its end, it reconnects (GET ``.../stream`` or ``.../events``) with ``Last-Event-ID`` set to
the last frame id it received, after an exponential backoff with jitter, so the frames it
yields have no gap and no duplicate in the durable modes, and the in-flight message is
resent from where the client is (see ``MessageAssembler``).

``MessageAssembler`` applies ``messages/*`` frames: the text and tool calls of each
assistant message as they are written, cut back where the producer went back (a replacement
worker resuming from its checkpoint), and replaced by the committed message when it arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from wakeful.backoff import backoff_delay
from wakeful.client.problems import error_for
from wakeful.errors import WakefulError
from wakeful.providers.sse import SSEDecoder

EVENT_STREAM = "text/event-stream"


@dataclass(frozen=True)
class Frame:
    """One frame: ``event`` is the frame name (an event type in ``events`` mode,
    ``updates``, ``values``, ``messages/delta``, ``messages/tool``, ``messages/reset``,
    ``messages/complete``, ``metadata``, ``end``); ``data`` is its decoded JSON."""

    event: str
    data: Any
    id: str | None


@dataclass(frozen=True)
class Backoff:
    """Reconnect delays: ``initial * 2**n`` up to ``maximum``, times a random factor in
    [1 - jitter, 1 + jitter]; ``attempts`` reconnects in a row at most (``None``: forever),
    after which the last error is raised. A frame received resets the count."""

    initial: float = 0.2
    maximum: float = 5.0
    jitter: float = 0.25
    attempts: int | None = 30

    def delay(self, failures: int) -> float:
        return backoff_delay(failures, self.initial, self.maximum, jitter=self.jitter)


Open = Callable[[str | None], Awaitable[httpx.Response]]
"""Opens the stream (again): given the ``Last-Event-ID`` to send (or ``None``), an httpx
response whose body has not been read."""


class Stream:
    """An async iterator of ``Frame`` that reconnects (see the module docstring). ``close``
    (or ``async with``) ends it. ``reconnects`` counts the reconnections made."""

    def __init__(
        self,
        first: Open,
        again: Open,
        backoff: Backoff,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        ends_on: frozenset[str] = frozenset(("end",)),
    ) -> None:
        self._first = first
        self._again = again
        self._backoff = backoff
        self._sleep = sleep
        self._ends_on = ends_on
        self.last_id: str | None = None
        self.reconnects = 0
        self.messages = MessageAssembler()
        """Every ``messages/*`` frame this stream yielded, applied."""
        self.metadata: dict[str, Any] | None = None
        """The ``metadata`` frame's data (a run's stream: what ``POST .../runs`` answers)."""
        self._response: httpx.Response | None = None
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Frame]:
        return self._frames()

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True
        if self._response is not None:
            await self._response.aclose()

    async def _frames(self) -> AsyncIterator[Frame]:
        failures = 0
        opener = self._first
        while not self._closed:
            try:
                self._response = await opener(self.last_id)
                opener = self._again
                if self._response.status_code >= 400:
                    await self._response.aread()
                    raise error_for(self._response.status_code, _json(self._response.content))
                decoder = SSEDecoder()
                async for chunk in self._response.aiter_bytes():
                    for event in decoder.feed(chunk):
                        frame = _frame(event.event, event.data, event.id)
                        if frame.event == "error":
                            raise error_for(int(frame.data.get("status", 500)), frame.data)
                        if event.id is not None:
                            self.last_id = event.id
                        failures = 0
                        self.messages.apply(frame)
                        if frame.event == "metadata" and isinstance(frame.data, dict):
                            self.metadata = frame.data
                        yield frame
                        if frame.event in self._ends_on:
                            return
            except WakefulError as exc:
                if not getattr(exc, "retryable", False):
                    raise
                failures = await self._backoff_or_raise(failures, exc)
                continue
            except (httpx.TransportError, httpx.StreamError) as exc:
                if self.closed:
                    return
                failures = await self._backoff_or_raise(failures, exc)
                continue
            finally:
                if self._response is not None:
                    await self._response.aclose()
            # the server ended the stream before an end frame: resume where we are
            self.reconnects += 1
            failures = await self._backoff_or_raise(failures, None)

    async def _backoff_or_raise(self, failures: int, exc: BaseException | None) -> int:
        failures += 1
        limit = self._backoff.attempts
        if limit is not None and failures > limit:
            if exc is not None:
                raise exc
            self._closed = True  # the server keeps ending the stream at once: it is over
            return failures
        if exc is not None:
            self.reconnects += 1
        await self._sleep(self._backoff.delay(failures))
        return failures


def _json(body: bytes) -> Any:
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body.decode("utf-8", "replace")


def _frame(event: str, data: str, frame_id: str | None) -> Frame:
    return Frame(event, _json(data.encode()), frame_id)


@dataclass
class AssembledMessage:
    """One assistant message as assembled from a stream."""

    message_id: str
    run_id: str | None = None
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False
    streamed_text: str | None = None
    """The text the deltas had assembled when the committed message arrived (``None`` if it
    arrived first); equal to ``text`` when the stream delivered every character once."""
    gaps: int = 0
    """Deltas that started beyond the assembled text (a server never sends one)."""


class MessageAssembler:
    """Applies ``messages/*`` frames (``apply``); ``messages`` by id, in arrival order."""

    def __init__(self) -> None:
        self.messages: dict[str, AssembledMessage] = {}

    def get(self, message_id: str) -> AssembledMessage | None:
        return self.messages.get(message_id)

    def _message(self, data: dict[str, Any]) -> AssembledMessage:
        mid = str(data.get("message_id"))
        m = self.messages.get(mid)
        if m is None:
            m = self.messages[mid] = AssembledMessage(mid, data.get("run_id"))
        return m

    def apply(self, frame: Frame) -> AssembledMessage | None:
        """Apply one frame; the message it changed, or ``None`` for other frames."""
        if not frame.event.startswith("messages/") or not isinstance(frame.data, dict):
            return None
        data = frame.data
        m = self._message(data)
        kind = frame.event.removeprefix("messages/")
        if kind == "complete":
            if not m.complete:
                m.streamed_text = m.text
            m.text = str(data.get("content") or "")
            m.tool_calls = list(data.get("tool_calls") or [])
            m.complete = True
            return m
        if m.complete:
            return m  # the committed message wins over anything late
        offset = int(data.get("offset") or 0)
        if kind == "reset":
            m.text = m.text[:offset]
            del m.tool_calls[int(data.get("tool_calls") or 0) :]
        elif kind == "delta":
            if offset > len(m.text):
                m.gaps += 1
                return m
            m.text = m.text[:offset] + str(data.get("text") or "")
        elif kind == "tool":
            index = int(data.get("index") or 0)
            while len(m.tool_calls) <= index:
                m.tool_calls.append({"id": None, "name": None, "arguments": ""})
            call = m.tool_calls[index]
            args = str(call.get("arguments") or "")
            if offset > len(args):
                m.gaps += 1
                return m
            call["arguments"] = args[:offset] + str(data.get("arguments") or "")
            for key in ("id", "name"):
                if data.get(key) is not None:
                    call[key] = data[key]
        return m


__all__ = ["AssembledMessage", "Backoff", "Frame", "MessageAssembler", "Stream"]
