"""Shared HTTP plumbing for the provider adapters: the client owner, ``Retry-After``
parsing and error classification (the server-sent events parser is ``providers.sse``, and is
re-exported here).

Classification reads status codes, the error ``type``/``code`` fields of a JSON error body and
the retry headers, never the display text. Nothing here retries.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, Self

import httpx
import msgspec

from wakeful.providers.base import ErrorKind, ProviderError
from wakeful.providers.sse import SSEDecoder as SSEDecoder  # re-exported: its old home
from wakeful.providers.sse import SSEEvent as SSEEvent
from wakeful.providers.sse import aiter_sse as aiter_sse
from wakeful.redact import header_secrets, redact

DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=10.0)
"""Used by the client an adapter creates itself: 10 s to connect, and 600 s for each read,
write and pool wait. The read timeout is the stream's idle timeout: the longest silence
allowed between two bytes (reasoning models can think for minutes before their first token).
"""

TimeoutLike = float | httpx.Timeout

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


_DURATION = re.compile(r"(?:([0-9.]+)h)?(?:([0-9.]+)m(?!s))?(?:([0-9.]+)s)?(?:([0-9.]+)ms)?")
_RESET_HEADERS: Final = (
    *(
        (f"x-ratelimit-reset-{r}", f"x-ratelimit-remaining-{r}", False)
        for r in ("requests", "tokens")
    ),
    *(
        (f"anthropic-ratelimit-{r}-reset", f"anthropic-ratelimit-{r}-remaining", True)
        for r in ("requests", "tokens", "input-tokens", "output-tokens")
    ),
)
"""(reset header, remaining header, whether the reset is a time rather than a duration)."""


def _duration(value: str) -> float | None:
    """OpenAI's reset durations: ``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``."""
    match = _DURATION.fullmatch(value.strip())
    if match is None or not any(match.groups()):
        return None
    h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s + ms / 1000


def _instant(value: str, now: float) -> float | None:
    """Anthropic's reset times: RFC 3339 (``2026-12-07T19:40:36Z``)."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _resets(headers: Mapping[str, str], now: float | None) -> tuple[list[float], list[float]]:
    """The resets (seconds from now) of the exhausted limits (``...-remaining: 0``) and of
    all the limits the headers name."""
    at = time.time() if now is None else now
    exhausted: list[float] = []
    every: list[float] = []
    for reset, remaining, is_time in _RESET_HEADERS:
        raw = headers.get(reset)
        seconds = None if raw is None else _instant(raw, at) if is_time else _duration(raw)
        if seconds is None:
            continue
        every.append(seconds)
        if (headers.get(remaining) or "").strip() == "0":
            exhausted.append(seconds)
    return exhausted, every


def reset_from_headers(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds until a rate limit resets, from the headers OpenAI
    (``x-ratelimit-reset-requests``/``-tokens``: durations) and Anthropic
    (``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset``: times) send:
    the latest reset of the exhausted resources (``...-remaining: 0``), else of all given."""
    exhausted, every = _resets(headers, now)
    found = exhausted or every
    return max(found) if found else None


def exhausted_from_headers(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """For a successful answer: seconds until the latest reset of a limit its rate-limit
    headers say is used up (``...-remaining: 0``; the next request would be refused until
    then), else ``None``. A reset already past is ``None`` too."""
    exhausted, _ = _resets(headers, now)
    latest = max(exhausted, default=0.0)
    return latest if latest > 0 else None


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
    "insufficient_quota": "auth",
    # llama.cpp's server
    "exceed_context_size_error": "context_overflow",
}
_CODE_KINDS: Final[Mapping[str, ErrorKind]] = {
    "context_length_exceeded": "context_overflow",
    "rate_limit_exceeded": "rate_limited",
    "insufficient_quota": "auth",
}
_QUOTA_WORDS: Final = frozenset(("insufficient_quota", "billing_error"))
_PERMANENT: Final = frozenset(("invalid_request", "auth", "not_found", "context_overflow"))
QUOTA_HINT: Final = (
    "credits or quota exhausted: add credits or raise the limit with the provider; "
    "retrying will not help"
)


def reports_error(body: Any) -> bool:
    """Whether a decoded JSON body or stream chunk reports an error, in any shape
    ``error_fields`` reads."""
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    return (error is not None and error != "") or body.get("object") == "error"


def error_fields(body: Any) -> tuple[str | None, str | None, str | None]:
    """``(type, code, message)`` of an error body, in the shapes servers send: OpenAI's
    ``{"error": {...}}``, Anthropic's ``{"type": "error", "error": {...}}``, a bare string
    ``{"error": "..."}`` (Ollama, LM Studio) and vLLM's top-level ``{"object": "error",
    "message", "type", "code"}``. A numeric ``code`` (an HTTP status, as OpenRouter,
    llama.cpp and vLLM send it) comes back as its decimal text. Missing or unusable fields
    are ``None``."""
    if not isinstance(body, dict):
        return None, None, None
    error = body.get("error")
    if isinstance(error, str):
        return None, None, error or None
    if not isinstance(error, dict):
        if body.get("object") != "error":
            return None, None, None
        error = body
    return _str(error.get("type")), _code(error.get("code")), _str(error.get("message"))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _code(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _str(value)


def _status_code(code: str | None) -> int | None:
    """An error ``code`` that is an HTTP error status (OpenRouter's ``502``, llama.cpp's
    ``400``), else ``None``."""
    if code is None or not code.isdigit() or len(code) != 3:
        return None
    status = int(code)
    return status if 400 <= status < 600 else None


def is_quota(status: int | None, error_type: str | None, error_code: str | None) -> bool:
    """Credits or quota exhausted: HTTP 402, OpenAI's ``insufficient_quota`` (sent with a
    429), Anthropic's ``billing_error``."""
    return status == 402 or bool(_QUOTA_WORDS & {error_type, error_code})


def classify(status: int | None, error_type: str | None, error_code: str | None) -> ErrorKind:
    """The error kind from an HTTP status and the body's error type and code.

    ``status=None`` is an error reported inside a stream: a ``code`` that is an HTTP error
    status stands in for the status; otherwise it is classified by type and code alone
    (unknown ones count as ``server``). The status decides except where the body is more
    precise: exhausted credits or quota (permanent ``auth``, even on a 429), a context
    overflow on a 4xx, an ``overloaded_error`` on a 5xx, and the permanent kinds its type
    names on an unlisted 4xx."""
    typed = _CODE_KINDS.get(error_code or "") or _TYPE_KINDS.get(error_type or "")
    if status is None:
        status = _status_code(error_code)
        if status is None:
            return typed or "server"
    if is_quota(status, error_type, error_code):
        return "auth"
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
    return with_request_id(text, request_id)


def with_request_id(detail: str, request_id: str | None) -> str:
    """``detail`` naming the request, once."""
    if not request_id or request_id in detail:
        return detail
    return f"{detail} (request id {request_id})"


def request_id_of(headers: Mapping[str, str]) -> str | None:
    """The provider's id for the request: ``request-id`` (Anthropic), ``x-request-id``
    (OpenAI, Groq, most gateways) or ``apim-request-id`` (Azure)."""
    for name in ("request-id", "x-request-id", "apim-request-id"):
        value = headers.get(name)
        if value:
            return value
    return None


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
    hint = QUOTA_HINT if is_quota(status, error_type, error_code) else None
    sent = response.request.headers if response._request is not None else {}
    return ProviderError(
        classify(status, error_type, error_code),
        _detail(
            error_type or error_code or f"HTTP {status}",
            hint,
            message,
            request_id=request_id_of(response.headers),
            secrets=header_secrets(sent),
        ),
        retry_after=_retry_after(status, response.headers),
        status=status,
    )


def _retry_after(status: int, headers: Mapping[str, str]) -> float | None:
    """The retry hint, and for a 429 without one the rate limits' reset."""
    hint = retry_after_from_headers(headers)
    if hint is None and status == 429:
        return reset_from_headers(headers)
    return hint


def error_from_event(body: Any, *, request_id: str | None = None) -> ProviderError:
    """Classify an error reported inside a stream (no HTTP status)."""
    error_type, error_code, message = error_fields(body)
    hint = QUOTA_HINT if is_quota(None, error_type, error_code) else None
    return ProviderError(
        classify(None, error_type, error_code),
        _detail(error_type or error_code or "stream error", hint, message, request_id=request_id),
    )


_TIMEOUT_PHASES: Final[Mapping[type[httpx.TimeoutException], tuple[str, str]]] = {
    httpx.ConnectTimeout: ("connect", "connecting"),
    httpx.WriteTimeout: ("write", "sending the request"),
    httpx.PoolTimeout: ("pool", "waiting for a free connection in the client's pool"),
}


def error_from_transport(
    exc: httpx.RequestError, exchange: Exchange | None = None
) -> ProviderError:
    """Classify a transport failure: timeouts (connect, read, write, pool) are ``timeout``;
    an unsupported URL scheme is ``invalid_request``; everything else (refused, reset,
    closed mid-body, undecodable) is ``connection``. A timeout's detail names the phase
    (connecting, waiting for the first byte, between chunks) and the timeout that fired;
    ``exchange``, the stream as far as it got, adds the request id and the bytes read."""
    request_id = exchange.request_id if exchange is not None else None
    if isinstance(exc, httpx.TimeoutException):
        return ProviderError(
            "timeout", _detail(_timeout_text(exc, exchange), request_id=request_id)
        )
    kind: ErrorKind = (
        "invalid_request" if isinstance(exc, httpx.UnsupportedProtocol) else "connection"
    )
    answered = exchange is not None and exchange.response is not None
    where = exchange.where() if exchange is not None and answered else None
    return ProviderError(kind, _detail(type(exc).__name__, str(exc), where, request_id=request_id))


def _timeout_text(exc: httpx.TimeoutException, exchange: Exchange | None) -> str:
    setting, phase = _TIMEOUT_PHASES.get(type(exc), ("read", ""))
    if not phase:  # a read timeout: where in the exchange did it strike?
        if exchange is None or exchange.body_bytes == 0:
            phase = "waiting for the first byte"
            if exchange is not None and exchange.response is not None:
                phase += " of the body (the headers had arrived)"
        else:
            phase = f"between chunks ({exchange.where()})"
    seconds = _configured_timeout(exc, setting)
    waited = f"gave up after {seconds:g} s (the {setting} timeout)" if seconds else "timed out"
    return f"{type(exc).__name__} {phase}: {waited}"


def _configured_timeout(exc: httpx.TimeoutException, setting: str) -> float | None:
    try:
        timeouts = exc.request.extensions.get("timeout") or {}
    except RuntimeError:  # an exception built without its request
        return None
    value = timeouts.get(setting) if isinstance(timeouts, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _not_a_stream(response: httpx.Response) -> ProviderError:
    """A 2xx answer with a JSON body: an error object with a type or code is classified by
    them; one without (LM Studio's ``{"error": "Unexpected endpoint or method. ..."}``)
    and a body that is not an error (a server that does not stream) are permanent."""
    body = _json_body(response)
    error_type, error_code, message = error_fields(body)
    request_id = request_id_of(response.headers)
    if error_type or error_code:
        error = error_from_event(body, request_id=request_id)
        return ProviderError(
            error.kind,
            error.detail,
            retry_after=retry_after_from_headers(response.headers),
            status=response.status_code,
        )
    what = (
        f"the server answered with an error instead of an event stream: {message} "
        "(is the base URL right? OpenAI-compatible servers serve {base_url}/chat/completions)"
        if message
        else "the server answered with JSON instead of an event stream (does it support streaming?)"
    )
    return ProviderError(
        "invalid_request", _detail(what, request_id=request_id), status=response.status_code
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


@dataclass
class Observation:
    """What one streamed exchange showed, for diagnostics (``wakeful providers check``):
    the response status and headers, how many events arrived, when the first body byte did,
    and the workarounds the adapter applied to the server's dialect."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    events: int = 0
    first_byte_after: float | None = None
    workarounds: list[str] = field(default_factory=list)

    def worked_around(self, what: str) -> None:
        if what not in self.workarounds:
            self.workarounds.append(what)


@dataclass
class Exchange:
    """One streamed HTTP exchange as far as it got, so that an error can say which request
    failed and where: the response (once its headers arrived), the provider's request id,
    and the body bytes read."""

    response: httpx.Response | None = None
    request_id: str | None = None
    started: float = field(default_factory=time.monotonic)
    body_bytes: int = 0
    observation: Observation | None = None

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The response body, counted."""
        assert self.response is not None
        async for chunk in self.response.aiter_bytes():
            if self.body_bytes == 0 and self.observation is not None:
                self.observation.first_byte_after = time.monotonic() - self.started
            self.body_bytes += len(chunk)
            yield chunk

    def limit_reset(self) -> float | None:
        """``exhausted_from_headers`` of the response (``None`` before it arrived)."""
        if self.response is None:
            return None
        return exhausted_from_headers(self.response.headers)

    def where(self) -> str:
        elapsed = time.monotonic() - self.started
        return f"after {self.body_bytes} bytes, {elapsed:.1f} s into the exchange"

    def annotate(self, error: ProviderError) -> ProviderError:
        """``error`` naming this request; the same error if it already does."""
        detail = with_request_id(error.detail, self.request_id)
        if detail == error.detail:
            return error
        return ProviderError(error.kind, detail, retry_after=error.retry_after, status=error.status)


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
        self,
        url: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        observation: Observation | None = None,
        *,
        params: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Exchange]:
        """POST ``body`` as JSON and yield the exchange once its status is 2xx; read the
        body with ``exchange.aiter_bytes()``. Error statuses and transport failures, during
        the request or while the caller reads the body, surface as ``ProviderError``; so
        do the caller's own ``ProviderError``s, with the request id added."""
        options: dict[str, Any] = {"params": params} if params else {}
        if not self._owns_client and self._timeout is not None:
            options["timeout"] = self._timeout
        request_headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            **headers,
        }
        exchange = Exchange(observation=observation)
        try:
            async with self._http().stream(
                "POST", url, content=msgspec.json.encode(body), headers=request_headers, **options
            ) as response:
                exchange.response = response
                exchange.request_id = request_id_of(response.headers)
                if observation is not None:
                    observation.status = response.status_code
                    observation.headers = dict(response.headers.items())
                if not 200 <= response.status_code < 300:
                    await response.aread()
                    raise error_from_response(response)
                if response.headers.get("content-type", "").startswith("application/json"):
                    await response.aread()
                    raise _not_a_stream(response)
                yield exchange
        except httpx.RequestError as exc:
            raise error_from_transport(exc, exchange) from exc
        except ProviderError as exc:
            annotated = exchange.annotate(exc)
            if annotated is exc:
                raise
            raise annotated from exc.__cause__
