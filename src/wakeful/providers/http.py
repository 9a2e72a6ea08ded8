"""Shared HTTP plumbing for the provider adapters: the client owner, a server-sent events
parser, ``Retry-After`` parsing and error classification.

Classification reads status codes, the error ``type``/``code`` fields of a JSON error body and
the retry headers, never the display text. Nothing here retries.
"""

from __future__ import annotations

import codecs
import email.utils
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC
from types import TracebackType
from typing import Any, Final, Self

import httpx
import msgspec

from wakeful.providers.base import ErrorKind, ProviderError
from wakeful.redact import header_secrets, redact

DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=10.0)
"""Used by the client an adapter creates itself: 10 s to connect, and 600 s for each read,
write and pool wait. The read timeout is the stream's idle timeout: the longest silence
allowed between two bytes (reasoning models can think for minutes before their first token).
"""

TimeoutLike = float | httpx.Timeout

# ----------------------------------------------------------------------------------- SSE


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
    data. Fields other than ``event``, ``data`` and ``id`` are ignored. An event that the
    stream does not finish with a blank line is never dispatched."""

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


# --------------------------------------------------------------------------- Retry-After

_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delay seconds or an HTTP date (a date
    in the past gives 0). Anything else gives ``None``. ``now`` is a Unix time, for tests."""
    if value is None:
        return None
    value = value.strip()
    if _NUMBER.fullmatch(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_after_from_headers(
    headers: Mapping[str, str], *, now: float | None = None
) -> float | None:
    """The provider's hint in seconds: ``retry-after-ms`` (OpenAI, Azure) wins over
    ``retry-after``. Not capped here; ``ProviderError`` caps it."""
    millis = headers.get("retry-after-ms")
    if millis is not None and _NUMBER.fullmatch(millis.strip()):
        return float(millis.strip()) / 1000.0
    return parse_retry_after(headers.get("retry-after"), now=now)


# ------------------------------------------------------------------------ classification

_TYPE_KINDS: Final[Mapping[str, ErrorKind]] = {
    # Anthropic error types
    "invalid_request_error": "invalid_request",
    "request_too_large": "invalid_request",
    "authentication_error": "auth",
    "permission_error": "auth",
    "billing_error": "auth",
    "not_found_error": "not_found",
    "rate_limit_error": "rate_limited",
    "api_error": "server",
    "timeout_error": "timeout",
    "overloaded_error": "overloaded",
    # OpenAI error types
    "server_error": "server",
}
_CODE_KINDS: Final[Mapping[str, ErrorKind]] = {
    "context_length_exceeded": "context_overflow",
    "rate_limit_exceeded": "rate_limited",
}
_PERMANENT: Final = frozenset(("invalid_request", "auth", "not_found", "context_overflow"))


def error_fields(body: Any) -> tuple[str | None, str | None, str | None]:
    """``(type, code, message)`` of an error body: OpenAI's ``{"error": {...}}`` or
    Anthropic's ``{"type": "error", "error": {...}}``. Missing or non-string fields are
    ``None``."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None, None, None
    return _str(error.get("type")), _str(error.get("code")), _str(error.get("message"))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def classify(status: int | None, error_type: str | None, error_code: str | None) -> ErrorKind:
    """The error kind from an HTTP status and the body's error type and code.

    ``status=None`` is an error reported inside a stream, classified by type alone (unknown
    types count as ``server``). The status decides except where the body is more precise: a
    ``context_length_exceeded`` code on a 4xx, an ``overloaded_error`` on a 5xx, and the
    permanent kinds its type names on an unlisted 4xx."""
    typed = _CODE_KINDS.get(error_code or "") or _TYPE_KINDS.get(error_type or "")
    if status is None:
        return typed or "server"
    if typed == "context_overflow" and 400 <= status < 500 and status != 429:
        return typed
    if status == 429:
        return "rate_limited"
    if status == 529:
        return "overloaded"
    if status == 408:
        return "timeout"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status >= 500:
        return "overloaded" if typed == "overloaded" else "server"
    return typed if typed in _PERMANENT else "invalid_request"


def _detail(
    *parts: str | None, request_id: str | None = None, secrets: list[str] | None = None
) -> str:
    text = redact(": ".join(p for p in parts if p), secrets or ()) or "no detail"
    if len(text) > 500:
        text = text[:497] + "..."
    return f"{text} (request id {request_id})" if request_id else text


def _json_body(response: httpx.Response) -> Any:
    try:
        return msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        return None


def error_from_response(response: httpx.Response) -> ProviderError:
    """Classify a failed HTTP response whose body has been read."""
    body = _json_body(response)
    error_type, error_code, message = error_fields(body)
    status = response.status_code
    if message is None and body is None:
        message = response.text.strip()[:200] or None
    request_id = response.headers.get("request-id") or response.headers.get("x-request-id")
    sent = response.request.headers if response._request is not None else {}
    return ProviderError(
        classify(status, error_type, error_code),
        _detail(
            error_type or error_code or f"HTTP {status}",
            message,
            request_id=request_id,
            secrets=header_secrets(sent),
        ),
        retry_after=retry_after_from_headers(response.headers),
        status=status,
    )


def error_from_event(body: Any) -> ProviderError:
    """Classify an error reported inside a stream (no HTTP status)."""
    error_type, error_code, message = error_fields(body)
    return ProviderError(
        classify(None, error_type, error_code),
        _detail(error_type or error_code or "stream error", message),
    )


def error_from_transport(exc: httpx.RequestError) -> ProviderError:
    """Classify a transport failure: timeouts (connect, read, write, pool) are ``timeout``;
    an unsupported URL scheme is ``invalid_request``; everything else (refused, reset,
    closed mid-body, undecodable) is ``connection``."""
    kind: ErrorKind
    if isinstance(exc, httpx.TimeoutException):
        kind = "timeout"
    elif isinstance(exc, httpx.UnsupportedProtocol):
        kind = "invalid_request"
    else:
        kind = "connection"
    return ProviderError(kind, _detail(type(exc).__name__, str(exc)))


def _not_a_stream(response: httpx.Response) -> ProviderError:
    """A 2xx answer with a JSON body: an error object classified by its type, else a server
    that does not stream (permanent)."""
    body = _json_body(response)
    if any(error_fields(body)):
        error = error_from_event(body)
        return ProviderError(
            error.kind,
            error.detail,
            retry_after=retry_after_from_headers(response.headers),
            status=response.status_code,
        )
    return ProviderError(
        "invalid_request",
        "the server answered with JSON instead of an event stream (does it support streaming?)",
        status=response.status_code,
    )


def truncated(what: str) -> ProviderError:
    """The stream ended without its terminal event."""
    return ProviderError("connection", f"stream ended before {what}")


def decode_json(data: str) -> Any:
    """A stream event's JSON payload; malformed JSON is a ``server`` error."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ProviderError("server", _detail("malformed stream event", str(exc))) from exc


# --------------------------------------------------------------------------- the client


class HTTPProvider:
    """Owns an ``httpx.AsyncClient`` (created on first use, closed by ``aclose``) or borrows
    the one given, which it never closes. ``timeout`` configures the owned client (default
    ``DEFAULT_TIMEOUT``); with a borrowed client it applies per request if given."""

    def __init__(self, *, client: httpx.AsyncClient | None, timeout: TimeoutLike | None) -> None:
        self._client = client
        self._owns_client = client is None
        self._timeout = timeout

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = DEFAULT_TIMEOUT if self._timeout is None else self._timeout
            self._client = httpx.AsyncClient(timeout=timeout)
        return self._client

    async def aclose(self) -> None:
        """Close the client if this adapter created it. A later call opens a new one."""
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @asynccontextmanager
    async def _post_stream(
        self, url: str, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> AsyncIterator[httpx.Response]:
        """POST ``body`` as JSON and yield the streaming response once its status is 2xx.
        Error statuses and transport failures, during the request or while the caller reads
        the body, surface as ``ProviderError``."""
        options: dict[str, Any] = {}
        if not self._owns_client and self._timeout is not None:
            options["timeout"] = self._timeout
        request_headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            **headers,
        }
        try:
            async with self._http().stream(
                "POST", url, content=msgspec.json.encode(body), headers=request_headers, **options
            ) as response:
                if not 200 <= response.status_code < 300:
                    await response.aread()
                    raise error_from_response(response)
                if response.headers.get("content-type", "").startswith("application/json"):
                    await response.aread()
                    raise _not_a_stream(response)
                yield response
        except httpx.RequestError as exc:
            raise error_from_transport(exc) from exc
