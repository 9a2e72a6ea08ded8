"""The in-flight assistant message of one thread, as a stream server knows it, and what each
stream client still lacks of it.

Two sources feed it: live events from a live channel (``message.started``, ``text.delta``,
``tool_call.delta``, each placed by its character offset and ordered by the producer's claim
token) and the run's stream checkpoint (the saved partial turn). Text is only ever extended
contiguously; a delta beyond what is known waits (bounded) until a checkpoint covers the gap.
A producer that goes back (a replacement process resuming from the checkpoint, a restarted
request) is a *rewind*: the text and tool calls are cut to where it resumes, and every
client is told so before it gets what follows.

A client is never sent a queue of deltas: ``Cursor.sync`` compares what the client has with
the current message and sends the difference, so a slow client gets fewer, larger frames and
the server holds one message per thread, whatever the number or speed of its clients.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from wakeful.records import StreamCheckpoint
from wakeful.runtime.events import LiveEvent

MAX_PENDING = 4096
"""Live events held while waiting for a checkpoint to fill a gap; beyond it they are dropped
(the checkpoint then supplies what they carried)."""
REWIND_HISTORY = 64


@dataclass
class InFlight:
    run_id: str
    message_id: str
    task_id: str | None
    token: int
    text: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    from_start: bool = False
    """This server saw the message from its first attempt's start, so its rewinds are known
    (a client resuming mid-message can then be sent only what follows its offset)."""
    min_rewind: int | None = None


def _call(raw: Any) -> dict[str, Any]:
    raw = raw if isinstance(raw, dict) else {}
    args = raw.get("arguments")
    return {
        "id": raw.get("id"),
        "name": raw.get("name"),
        "arguments": args if isinstance(args, str) else "",
    }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _common(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Tracker:
    """Applies live events and checkpoints to the thread's in-flight message. Every method
    returns whether anything changed (``version`` then increased)."""

    def __init__(self) -> None:
        self.message: InFlight | None = None
        self.version = 0
        self._rewinds: deque[tuple[int, int, int]] = deque()
        self._forgotten = 0
        """Rewinds up to this version are no longer remembered."""
        self._completed: deque[str] = deque(maxlen=64)
        self.pending: list[LiveEvent] = []
        self.needs_checkpoint = False

    # ---------------------------------------------------------------- bookkeeping

    def _bump(self) -> None:
        self.version += 1

    def _rewind(self, offset: int, calls: int) -> None:
        m = self.message
        assert m is not None
        if offset >= len(m.text) and calls >= len(m.calls):
            return
        m.text = m.text[:offset]
        del m.calls[calls:]
        m.min_rewind = offset if m.min_rewind is None else min(m.min_rewind, offset)
        self._bump()
        self._rewinds.append((self.version, offset, calls))
        if len(self._rewinds) > REWIND_HISTORY:
            self._forgotten = self._rewinds.popleft()[0]

    def rewind_since(self, version: int) -> tuple[int, int] | None:
        """The lowest text offset and call count rewound to after ``version``; ``(0, 0)``
        when those rewinds are forgotten; ``None`` when there was none."""
        if version < self._forgotten:
            return (0, 0)
        found = [(o, c) for v, o, c in self._rewinds if v > version]
        if not found:
            return None
        return min(o for o, _ in found), min(c for _, c in found)

    def is_completed(self, message_id: str) -> bool:
        return message_id in self._completed

    def complete(self, message_id: str) -> bool:
        """The message was committed (its ``message.completed`` event was read)."""
        if message_id not in self._completed:
            self._completed.append(message_id)
        if self.message is not None and self.message.message_id == message_id:
            self.message = None
            self.pending.clear()
            self.needs_checkpoint = False
            self._bump()
            return True
        return False

    def run_ended(self, run_id: str | None) -> bool:
        if self.message is not None and (run_id is None or self.message.run_id == run_id):
            self.message = None
            self.pending.clear()
            self.needs_checkpoint = False
            self._bump()
            return True
        return False

    # ---------------------------------------------------------------- live events

    def on_live(self, event: LiveEvent) -> bool:
        data = event.data if isinstance(event.data, dict) else {}
        mid, token = data.get("message_id"), _int(data.get("token"))
        if not isinstance(mid, str) or token is None or mid in self._completed:
            return False
        m = self.message
        if m is not None and m.message_id == mid and token < m.token:
            return False  # a fenced producer still streaming
        created = m is None or m.message_id != mid
        if m is None or m.message_id != mid:
            task = data.get("task_id")
            m = InFlight(event.run_id, mid, task if isinstance(task, str) else None, token)
            self.message, self.pending = m, []
            self._bump()
        m.token = token
        if event.type == "message.started":
            return self._started(m, data) or created
        if event.type == "text.delta":
            return self._text(event, m, data)
        if event.type == "tool_call.delta":
            return self._tool(event, m, data)
        return False

    def _started(self, m: InFlight, data: dict[str, Any]) -> bool:
        offset, calls = _int(data.get("offset")), _int(data.get("tool_calls"))
        if offset is None or calls is None:
            return False
        if offset == 0 and calls == 0 and not m.text and not m.calls:
            m.from_start = True
        if offset <= len(m.text) and calls <= len(m.calls):
            before = self.version
            self._rewind(offset, calls)
            self.pending = []  # beyond what was known: the producer's earlier attempt
            return self.version != before
        self.needs_checkpoint = True  # it resumes beyond what this server knows
        return False

    def _text(self, event: LiveEvent, m: InFlight, data: dict[str, Any]) -> bool:
        offset, text = _int(data.get("offset")), data.get("text")
        if offset is None or not isinstance(text, str):
            return False
        if offset > len(m.text):
            self._hold(event)
            return False
        if m.text.startswith(text, offset) and offset + len(text) <= len(m.text):
            return False  # already known
        if offset < len(m.text):
            self._rewind(offset, len(m.calls))
        m.text += text
        self._bump()
        return True

    def _tool(self, event: LiveEvent, m: InFlight, data: dict[str, Any]) -> bool:
        index, offset, args = (
            _int(data.get("index")),
            _int(data.get("offset")),
            data.get("arguments"),
        )
        if index is None or offset is None or not isinstance(args, str):
            return False
        if index > len(m.calls) or (index == len(m.calls) and offset > 0):
            self._hold(event)
            return False
        if index == len(m.calls):
            m.calls.append({"id": None, "name": None, "arguments": ""})
        call = m.calls[index]
        if offset > len(call["arguments"]):
            self._hold(event)
            return False
        for key in ("id", "name"):
            if isinstance(data.get(key), str):
                call[key] = data[key]
        call["arguments"] = call["arguments"][:offset] + args
        self._bump()
        return True

    def _hold(self, event: LiveEvent) -> None:
        self.needs_checkpoint = True
        if len(self.pending) >= MAX_PENDING:
            self.pending.clear()
        self.pending.append(event)

    def _replay(self) -> None:
        pending, self.pending = self.pending, []
        for event in pending:
            self.on_live(event)
        self.needs_checkpoint = bool(self.pending)

    # ---------------------------------------------------------------- checkpoints

    def on_checkpoint(self, cp: StreamCheckpoint, *, authoritative: bool) -> bool:
        """Apply the run's stream checkpoint. ``authoritative`` (no live channel): the
        checkpoint is the only source, so where it differs from what is known it wins (a
        rewind); otherwise it only fills what the live events left out."""
        mid = cp.message_id or f"m-{cp.run_id}-{cp.task_id}"
        if mid in self._completed:
            return False
        text = cp.partial_text
        calls = [_call(c) for c in cp.tool_calls]
        if cp.in_flight_tool is not None:
            calls.append(_call(cp.in_flight_tool))
        m = self.message
        if m is not None and m.message_id == mid and cp.token < m.token:
            return False
        if m is None or m.message_id != mid:
            self.message = InFlight(cp.run_id, mid, cp.task_id, cp.token, text, calls)
            self._bump()
            self._replay()
            return True
        before = self.version
        if authoritative:
            common = _common(m.text, text)
            kept = 0
            while kept < min(len(m.calls), len(calls)) and _extends(calls[kept], m.calls[kept]):
                kept += 1
            self._rewind(common, kept)
            if text != m.text or calls != m.calls:
                m.text, m.calls = text, calls
                self._bump()
        elif len(text) > len(m.text) and text.startswith(m.text):
            m.text = text
            if len(calls) >= len(m.calls):
                m.calls = calls
            self._bump()
        self._replay()
        return self.version != before


def _extends(new: dict[str, Any], old: dict[str, Any]) -> bool:
    return (
        new.get("id") == old.get("id")
        and new.get("name") == old.get("name")
        and str(new.get("arguments")).startswith(str(old.get("arguments")))
    )


@dataclass
class Cursor:
    """What one client has of the in-flight message; ``sync`` returns the frames it lacks
    as ``(kind, data)`` with kind ``reset``, ``delta`` or ``tool``."""

    message_id: str | None = None
    text: int = 0
    calls: dict[int, int] = field(default_factory=dict)
    version: int = 0
    resume: tuple[str, int] | None = None
    """``(tag, offset)`` from the client's ``Last-Event-ID``."""
    done: set[str] = field(default_factory=set)
    """Messages this client got the committed version of."""

    def sync(self, tracker: Tracker, tag_of: Any) -> list[tuple[str, dict[str, Any]]]:
        m = tracker.message
        if m is None or m.message_id in self.done:
            return []
        frames: list[tuple[str, dict[str, Any]]] = []
        base = {"run_id": m.run_id, "message_id": m.message_id}
        if m.message_id != self.message_id:
            self.message_id, self.text, self.calls = m.message_id, 0, {}
            if self.resume is not None and self.resume[0] == tag_of(m.message_id):
                offset = self.resume[1]
                trusted = m.from_start and (m.min_rewind is None or m.min_rewind >= offset)
                if trusted and offset <= len(m.text):
                    self.text = offset
            self.resume = None
        else:
            rewound = tracker.rewind_since(self.version)
            if rewound is not None:
                offset, calls = min(rewound[0], self.text), min(rewound[1], len(self.calls))
                if offset < self.text or calls < len(self.calls):
                    frames.append(("reset", {**base, "offset": offset, "tool_calls": calls}))
                    self.text = offset
                    self.calls = {i: n for i, n in self.calls.items() if i < calls}
        if len(m.text) < self.text:  # cut without a remembered rewind: say so
            frames.append(("reset", {**base, "offset": len(m.text), "tool_calls": len(m.calls)}))
            self.text = len(m.text)
        if len(m.text) > self.text:
            frames.append(("delta", {**base, "offset": self.text, "text": m.text[self.text :]}))
            self.text = len(m.text)
        for index, call in enumerate(m.calls):
            sent = self.calls.get(index)
            args = call["arguments"]
            if sent is not None and len(args) <= sent:
                continue
            start = sent or 0
            frames.append(
                (
                    "tool",
                    {
                        **base,
                        "index": index,
                        "id": call.get("id"),
                        "name": call.get("name"),
                        "offset": start,
                        "arguments": args[start:],
                    },
                )
            )
            self.calls[index] = len(args)
        self.version = tracker.version
        return frames


__all__ = ["Cursor", "InFlight", "Tracker"]
