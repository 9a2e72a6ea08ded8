"""An incremental ``text/event-stream`` parser, shared by the provider adapters."""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched server-sent event. ``event`` defaults to ``"message"``; ``data`` is the
    event's ``data:`` lines joined by ``"\\n"``; ``id`` is the last event id seen so far."""

    event: str = "message"
    data: str = ""
    id: str | None = None


class SSEDecoder:
    """An incremental ``text/event-stream`` parser, following the WHATWG algorithm.

    Feed it bytes (UTF-8, split anywhere) or text; it returns the events completed so far.
    Lines end with CRLF, LF or CR; a leading byte-order mark is dropped; ``:`` lines are
    comments; ``data:`` lines accumulate; a blank line dispatches the event unless it has no
    data. Fields other than ``event``, ``data``, ``id`` and ``error`` are ignored. An event
    that the stream does not finish with a blank line is never dispatched.

    ``error`` is not a standard field: llama.cpp's server (through its 2025 builds) sent a
    mid-stream failure as ``error: {json}``, which a strict parser drops, turning the failure
    into a clean end. Its value is kept as the data of an event named ``error``."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._at_start = True
        self._event = ""
        self._data: list[str] = []
        self._last_id: str | None = None

    def feed(self, chunk: bytes | str) -> list[SSEEvent]:
        text = self._utf8.decode(chunk) if isinstance(chunk, bytes) else chunk
        if self._at_start and text:
            self._at_start = False
            text = text.removeprefix("\ufeff")
        buf = self._buffer + text
        events: list[SSEEvent] = []
        pos, end = 0, len(buf)
        while pos < end:
            lf = buf.find("\n", pos)
            cr = buf.find("\r", pos, lf if lf >= 0 else end)
            if cr >= 0:
                if cr + 1 == end:
                    break  # a CR at the end: wait to see whether an LF follows
                line, pos = buf[pos:cr], cr + (2 if buf[cr + 1] == "\n" else 1)
            elif lf >= 0:
                line, pos = buf[pos:lf], lf + 1
            else:
                break
            event = self._line(line)
            if event is not None:
                events.append(event)
        self._buffer = buf[pos:]
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: a final CR still ends its line; an unfinished event is dropped."""
        tail = self._utf8.decode(b"", final=True)
        events = self.feed(tail) if tail else []
        if self._buffer.endswith("\r"):
            event = self._line(self._buffer[:-1])
            events.extend([event] if event is not None else [])
        self._buffer, self._event, self._data = "", "", []
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "error":
            self._event = "error"
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._last_id = value
        return None

    def _dispatch(self) -> SSEEvent | None:
        event, self._event = self._event or "message", ""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return SSEEvent(event, data, self._last_id)


async def aiter_sse(chunks: AsyncIterator[bytes]) -> AsyncIterator[SSEEvent]:
    """The events of a byte stream, as they complete."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.close():
        yield event
