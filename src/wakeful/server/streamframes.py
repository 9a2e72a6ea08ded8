"""The frames of a thread stream and their ids (``docs/http-api.md``, "Streams").

Every frame's ``id`` says how far the client has got, for every mode at once:

- ``<seq>``: everything derived from the durable events up to ``seq`` was sent;
- ``<seq>.<part>``: the events before ``seq`` were, and the first ``part + 1`` frames that
  event ``seq`` gives (one event can give an ``events``, an ``updates`` or ``values`` and a
  ``messages/complete`` frame);
- ``<seq>/<tag>/<offset>``: the events up to ``seq``, and ``offset`` characters of the
  in-flight message whose id hashes to ``tag``.

A client resumes by sending the last id it got as ``Last-Event-ID``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from wakeful.errors import InvalidInput
from wakeful.records import Event
from wakeful.server.routes.params import MAX_SEQ

MODES = ("events", "messages", "updates", "values")
DEFAULT_MODES = ("events", "messages")
MAX_CURSOR = 64
VALUE_EVENTS = frozenset(("run.started", "step.completed", "run.completed"))
"""Events committed with a new checkpoint whose state ``values`` sends."""
TERMINAL = frozenset(
    ("run.completed", "run.suspended", "run.failed", "run.cancelled", "run.indeterminate")
)

CURSOR_PATTERN = r"^[0-9]{1,19}(\.[0-9]{1,3}|/[0-9a-f]{12}/[0-9]{1,12})?$"
"""A frame id, as the OpenAPI document states it (``parse_cursor`` reads the parts)."""
_CURSOR = re.compile(r"(\d{1,19})(?:\.(\d{1,3})|/([0-9a-f]{12})/(\d{1,12}))?")


@dataclass(frozen=True)
class StreamCursor:
    """Where a stream starts: after durable event ``after``, skipping the first
    ``skip_parts`` frames of event ``after + 1``, and (``tag``, ``offset``) of a message."""

    after: int = 0
    skip_parts: int = 0
    tag: str | None = None
    offset: int = 0


def parse_cursor(text: str) -> StreamCursor:
    """A frame id as the client sends it back; ``InvalidInput`` (422) if it is not one."""
    match = _CURSOR.fullmatch(text.strip()) if len(text) <= MAX_CURSOR else None
    if match is not None and int(match.group(1)) > MAX_SEQ:
        # refused here, as the id it is, not later by the store as another field (a
        # submit-and-stream would have queued the run by then)
        raise InvalidInput("Last-Event-ID", f"{text[:70]!r}: a seq is at most {MAX_SEQ}")
    if match is None:
        raise InvalidInput(
            "Last-Event-ID",
            f"{text[:70]!r} is not an id this stream sent (<seq>, <seq>.<part> or "
            "<seq>/<tag>/<offset>)",
        )
    seq, part, tag, offset = match.groups()
    if part is not None:
        return StreamCursor(after=max(int(seq) - 1, 0), skip_parts=int(part) + 1)
    return StreamCursor(after=int(seq), tag=tag, offset=int(offset or 0))


def parse_modes(raw: str | None) -> tuple[str, ...]:
    """``events,messages,...`` in the canonical order; ``InvalidInput`` names the unknown."""
    if raw is None or not raw.strip():
        return DEFAULT_MODES
    asked = [m.strip() for m in raw.split(",") if m.strip()]
    unknown = sorted({m for m in asked if m not in MODES})
    if unknown:
        raise InvalidInput(
            "modes",
            f"unknown stream mode(s) {', '.join(map(repr, unknown))}; "
            f"supported: {', '.join(MODES)}",
        )
    return tuple(m for m in MODES if m in asked)


def tag(message_id: str) -> str:
    return hashlib.sha256(message_id.encode()).hexdigest()[:12]


def frame(frame_id: str | None, name: str, data: bytes) -> bytes:
    head = b"id: %s\n" % frame_id.encode() if frame_id is not None else b""
    safe = name.replace("\r", " ").replace("\n", " ").encode("utf-8")
    return head + b"event: %s\ndata: %s\n\n" % (safe, data)


def durable_parts(event: Event, modes: tuple[str, ...]) -> list[tuple[str, Any]]:
    """The frames ``event`` gives in ``modes``, in order, as ``(name, data)``; a ``values``
    frame's data is the checkpoint id to read (``_ValuesOf``), resolved by the caller."""
    parts: list[tuple[str, Any]] = []
    data = event.data if isinstance(event.data, dict) else {}
    if "events" in modes:
        parts.append((event.type, msgspec.json.encode(event)))
    if "updates" in modes and event.type == "task.completed" and "updates" in data:
        parts.append(
            (
                "updates",
                {
                    "seq": event.seq,
                    "run_id": event.run_id,
                    "step": data.get("step"),
                    "node": data.get("node"),
                    "task_id": event.task_id,
                    "updates": data.get("updates"),
                },
            )
        )
    if "values" in modes and event.type in VALUE_EVENTS and event.checkpoint_id:
        parts.append(("values", ValuesOf(event)))
    if (
        "messages" in modes
        and event.type == "message.completed"
        and isinstance(data.get("message_id"), str)
    ):
        parts.append(
            (
                "messages/complete",
                {
                    "seq": event.seq,
                    "run_id": event.run_id,
                    "message_id": data["message_id"],
                    "content": data.get("content"),
                    "tool_calls": data.get("tool_calls") or [],
                },
            )
        )
    return parts


@dataclass(frozen=True)
class ValuesOf:
    event: Event

    def body(self, found: bool, state: Any) -> dict[str, Any]:
        data = self.event.data if isinstance(self.event.data, dict) else {}
        step = data.get("step")
        return {
            "seq": self.event.seq,
            "run_id": self.event.run_id,
            "checkpoint_id": self.event.checkpoint_id,
            "after": self.event.type,
            "step": step,
            "values": state if found else None,
            "pruned": not found,
        }


__all__ = [
    "DEFAULT_MODES",
    "MODES",
    "TERMINAL",
    "StreamCursor",
    "ValuesOf",
    "durable_parts",
    "frame",
    "parse_cursor",
    "parse_modes",
    "tag",
]
