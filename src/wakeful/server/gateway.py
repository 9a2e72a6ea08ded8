"""The ASGI middleware every request passes, in this order: metrics (outermost, so every
answer is counted), the Host and Origin rules (``wakeful.fleet.exposure``: 421, 400 or
403), authentication (before any body is read), the body bounds (413 for a
body too large, 408 for one that does not arrive in time), the JSON bounds of a JSON body
(422: no NaN or infinity, at most ``MAX_JSON_DEPTH`` levels, UTF-8), and a last-resort guard
that turns an unhandled error into a generic 500 problem."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wakeful import telemetry
from wakeful.errors import InvalidInput
from wakeful.fleet.exposure import PROBES, Exposure
from wakeful.metrics import Metrics
from wakeful.redact import redact_query
from wakeful.server.auth import Authenticator, Caller
from wakeful.server.problems import problem, problem_for, validation_problem
from wakeful.store.validate import MAX_JSON_DEPTH, check_json

log = logging.getLogger("wakeful.server")

CALLER_KEY = "wakeful.caller"
DRAIN_FACTOR = 4
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
PROTECTED_PREFIX = "/v1/"
"""Paths under it need a bearer token; ``/healthz``, ``/readyz``, ``/metrics`` and the
OpenAPI document do not."""


class Gateway:
    """Pure ASGI middleware (it does not buffer responses, so SSE streams pass through)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        authenticator: Authenticator,
        metrics: Metrics,
        max_body_bytes: int,
        body_timeout: float,
        templates: Callable[[], list[str]],
        exposure: Exposure | None = None,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.exposure = exposure or Exposure(development=authenticator.development)
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.templates = templates
        self._patterns: list[tuple[re.Pattern[str], str]] | None = None
        # other instrumentations' server spans (opentelemetry-instrument's ASGI one records
        # url.query as sent) are cleaned like the gateway's own
        telemetry.redact_spans()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [0]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        span = _server_span(scope)
        try:
            with telemetry.use(span):
                await self._handle(scope, receive, sending, status)
        finally:
            route = self._route(scope)
            method = str(scope.get("method", ""))
            method = method if method in METHODS else "OTHER"  # bounded label values
            code = str(status[0] or 500)
            _end_server_span(span, method, route, status[0] or 500)
            self.metrics.http_requests.inc(route=route, method=method, status=code)
            self.metrics.http_seconds.observe(
                time.perf_counter() - started, route=route, method=method
            )
            if status[0] == 409:
                self.metrics.conflicts.inc(route=route)

    async def _handle(self, scope: Scope, receive: Receive, send: Send, status: list[int]) -> None:
        path = str(scope.get("path", ""))
        method = str(scope.get("method", ""))
        refused = self.exposure.refusal(method, scope.get("headers", ()), probe=path in PROBES)
        if refused is not None:
            answer = problem(
                refused.status, refused.slug, refused.detail, title=refused.title, instance=path
            )
            await answer(scope, receive, send)
            return
        if path.startswith(PROTECTED_PREFIX):
            caller = self._authenticate(scope)
            if isinstance(caller, Response):
                await caller(scope, receive, send)
                return
            scope[CALLER_KEY] = caller
        try:
            async with asyncio.timeout(self.body_timeout):
                buffered = await self._read_body(scope, receive)
        except TimeoutError:
            buffered = problem(
                408,
                "body-timeout",
                f"the request body did not arrive within {self.body_timeout:g} seconds",
                title="Request timeout",
                instance=path,
                headers={"Connection": "close"},
                timeout=self.body_timeout,
            )
        if isinstance(buffered, Response):
            await buffered(scope, receive, send)
            return
        try:
            await self.app(scope, buffered, send)
        except Exception as exc:
            if status[0]:
                log.error("error after the response started on %s", path, exc_info=exc)
                return
            await problem_for(exc, path)(scope, receive, send)

    def _authenticate(self, scope: Scope) -> Caller | Response:
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        caller = self.authenticator.resolve(header)
        if isinstance(caller, Caller):
            return caller
        path = str(scope.get("path", ""))
        if caller == "missing":
            return problem(
                401,
                "unauthenticated",
                "send Authorization: Bearer <token>",
                instance=path,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return problem(
            401,
            "unauthenticated",
            "the bearer token is not valid",
            instance=path,
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )

    async def _read_body(self, scope: Scope, receive: Receive) -> Receive | Response:
        """Read the whole body (at most ``max_body_bytes``) and return a ``receive`` that
        replays it, then passes on (so a stream still sees the client disconnect).

        A body over the limit is answered 413. Up to ``DRAIN_FACTOR`` times the limit is read
        and discarded first, so a client still sending gets the answer rather than a reset
        connection; a larger declared body is refused at once."""
        limit = self.max_body_bytes
        drain = limit * DRAIN_FACTOR
        path = str(scope.get("path", ""))
        too_large = problem(
            413,
            "too-large",
            f"the request body is larger than {limit} bytes",
            title="Body too large",
            instance=path,
            headers={"Connection": "close"},
            limit=limit,
        )
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > drain:
                return too_large
        chunks: list[bytes] = []
        size = 0
        first: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                first = message
                break
            body = message.get("body", b"")
            size += len(body)
            if size <= limit:
                chunks.append(body)
            elif not message.get("more_body", False) or size > drain:
                return too_large
            if not message.get("more_body", False):
                break
        if first is None:
            refused = _refuse_json(scope, b"".join(chunks))
            if refused is not None:
                return refused
        replay: list[Message] = [
            first or {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        ]

        async def replaying() -> Message:
            if replay:
                return replay.pop()
            return await receive()

        return replaying

    def _route(self, scope: Scope) -> str:
        """The route template (bounded label values), also for answers given before routing
        (401, 413)."""
        path = getattr(scope.get("route"), "path", None)
        if isinstance(path, str):
            return path
        if self._patterns is None:
            self._patterns = [(_compile(t), t) for t in self.templates()]
        raw = str(scope.get("path", ""))
        for pattern, template in self._patterns:
            if pattern.fullmatch(raw):
                return template
        return "unmatched"


class _NotJson(ValueError):
    pass


def _no_constants(name: str) -> Any:
    raise _NotJson(f"contains {name}, which JSON does not have")


def _is_json(scope: Scope) -> bool:
    """Whether the routes parse this body as JSON (FastAPI: ``application/json`` or
    ``application/*+json``; a body without a content type is not parsed)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media = str(value.decode("latin-1")).split(";", 1)[0].strip().lower()
            return media == "application/json" or (
                media.startswith("application/") and media.endswith("+json")
            )
    return False


def _refuse_json(scope: Scope, body: bytes) -> Response | None:
    """422 for a JSON body that would be changed or unreadable once stored: bytes that are
    not UTF-8, ``NaN``/``Infinity`` (Python's parser accepts them) or a number too large for
    a float, an integer longer than Python converts (``sys.get_int_max_str_digits()``,
    4,300 digits), nesting deeper than ``MAX_JSON_DEPTH``. Malformed JSON is left to the route,
    which answers it 422 as well."""
    if not body or not _is_json(scope):
        return None
    path = str(scope.get("path", ""))
    try:
        check_json("body", json.loads(body.decode("utf-8"), parse_constant=_no_constants))
    except UnicodeDecodeError:
        problem_text = "is not UTF-8"
    except _NotJson as exc:
        problem_text = str(exc)
    except RecursionError:
        problem_text = f"nests deeper than {MAX_JSON_DEPTH} arrays/objects (the limit)"
    except InvalidInput as exc:
        problem_text = exc.problem
    except json.JSONDecodeError:
        return None
    except ValueError:  # the only other refusal: an integer past the conversion limit
        problem_text = (
            f"contains an integer longer than {sys.get_int_max_str_digits()} digits (the limit)"
        )
    else:
        return None
    error = {"loc": ("body",), "msg": f"the body {problem_text}", "type": "json_invalid"}
    return validation_problem([error], path)


def _compile(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{[^}]+\}", template)
    return re.compile("[^/]+".join(re.escape(p) for p in parts))


__all__ = ["CALLER_KEY", "Gateway"]


def _server_span(scope: Scope) -> telemetry.SpanLike:
    """The request's server span, continuing the caller's ``traceparent`` if it sent one."""
    if telemetry.tracer() is None:
        return telemetry.NO_SPAN
    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", ())
        if name in (b"traceparent", b"tracestate")
    }
    method = str(scope.get("method", ""))
    attributes = {"http.request.method": method, "url.path": str(scope.get("path", ""))}
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    if query:  # credentials in a query (?access_token=, the console's streams) never recorded
        attributes["url.query"] = redact_query(query)
    return telemetry.start(
        method if method in METHODS else "HTTP",
        attributes,
        kind=telemetry.kind("server"),
        parent=telemetry.extract(carrier),
    )


def _end_server_span(span: telemetry.SpanLike, method: str, route: str, status: int) -> None:
    if span is telemetry.NO_SPAN:
        return
    span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    span.update_name(f"{method} {route}")  # type: ignore[attr-defined]
    if status >= 500:
        span.set_attribute("error.type", str(status))
    telemetry.finish(span)
