"""The provider protocol: one streamed model turn as text deltas, tool-call deltas and an
end marker, with typed errors that say whether and when to retry.

Adapters classify failures from status codes, error types and headers, never from display
text, and never retry on their own: retrying and stream recovery belong to the agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import msgspec

from wakeful.errors import WakefulError
from wakeful.records import Message

ErrorKind: TypeAlias = Literal[
    "rate_limited",
    "overloaded",
    "timeout",
    "server",
    "connection",
    "invalid_request",
    "auth",
    "context_overflow",
    "not_found",
]
RETRYABLE_KINDS: frozenset[str] = frozenset(
    ("rate_limited", "overloaded", "timeout", "server", "connection")
)
MAX_RETRY_AFTER = 60.0
"""Provider retry hints are honoured up to this many seconds."""


class ProviderError(WakefulError):
    """A model call failed. ``retryable`` follows from ``kind``; ``retry_after`` is the
    provider's hint in seconds (already capped at 60), if it gave one; ``status`` is the HTTP
    status when there was one."""

    def __init__(
        self,
        kind: ErrorKind,
        detail: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        self.kind = kind
        self.detail = detail
        self.status = status
        self.retry_after = (
            None if retry_after is None else min(max(retry_after, 0.0), MAX_RETRY_AFTER)
        )
        self.retryable = kind in RETRYABLE_KINDS
        hint = f", retry after {self.retry_after:g} s" if self.retry_after is not None else ""
        code = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"model call failed: {kind}{code}{hint}: {detail}")


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as the model sees it: ``parameters`` is a JSON schema object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One turn's request. ``messages`` use wakeful's ``Message``: assistant tool calls are
    ``{"id", "name", "arguments"}`` with ``arguments`` the JSON text; tool results are
    ``role="tool"`` messages with ``tool_call_id``."""

    model: str
    messages: tuple[Message, ...]
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 4096
    temperature: float | None = None


class TextDelta(msgspec.Struct, frozen=True, tag="text"):
    text: str


class ToolCallDelta(msgspec.Struct, frozen=True, tag="tool_call"):
    """A fragment of tool call ``index``: the first fragment of a call carries ``id`` and
    ``name``; ``arguments`` fragments concatenate to the call's JSON arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class Usage(msgspec.Struct, frozen=True):
    input_tokens: int = 0
    output_tokens: int = 0


class StreamEnd(msgspec.Struct, frozen=True, tag="end"):
    """The turn finished normally. ``stop_reason`` is normalised: ``end_turn``,
    ``tool_use``, ``max_tokens`` or the provider's own word."""

    stop_reason: str
    usage: Usage | None = None
    limit_reset: float | None = None
    """Seconds until the provider's rate limit resets when its rate-limit headers said a
    limit is used up by this call (``remaining: 0``): the next call would be refused until
    then. ``None``: not used up, or not said."""


StreamItem: TypeAlias = TextDelta | ToolCallDelta | StreamEnd


@runtime_checkable
class Provider(Protocol):
    """Streams one model turn. Raises ``ProviderError`` before or during the stream; a
    stream that ends without a ``StreamEnd`` was interrupted."""

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]: ...
