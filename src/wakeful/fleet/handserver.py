"""The hand service over HTTP (FastAPI), and ``serve_hand`` to run it with uvicorn.

Routes:

- ``POST /v1/calls`` with ``{"operation_id", "tool", "arguments"}`` (at most
  ``MAX_BODY_BYTES``) answers 200 with ``{"operation_id", "tool", "status": "done" |
  "error" | "indeterminate", "result", "error", "replayed"}``; 409 when the operation id was
  used for another tool or other arguments; 422 for a malformed body or an unknown tool;
  413 for a body that is too large.
- ``GET /v1/calls/{operation_id}``: the ledger's record (``status`` is ``running``,
  ``done``, ``error`` or ``indeterminate``), or 404.
- ``GET /healthz``: 200 when the ledger answers.

Who may call it (decision 0034): with ``tokens`` (the API's scheme, ``wakeful.fleet.tokens``;
``wakeful hand serve`` reads ``--tokens`` or ``WAKEFUL_HAND_TOKENS``) every ``/v1/`` route
needs ``Authorization: Bearer <token>`` (401); without, anyone who reaches it may run every
tool and read every recorded call, so it answers loopback Host names (and
``allowed_hosts``) only. In every mode a ``POST`` from another web origin is refused 403 and
``POST /v1/calls`` takes ``application/json`` only (415), so no web page can make it run a
tool.

Errors are RFC 9457 problem documents (``application/problem+json``) with ``type``,
``title``, ``status``, ``detail`` and, where it applies, ``operation_id`` and ``errors``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from starlette.exceptions import HTTPException

from wakeful.errors import InvalidInput, InvalidState, NotFound, WakefulError
from wakeful.fleet.exposure import PROBES, Exposure
from wakeful.fleet.hand import HandConflict, HandService, UnknownTool
from wakeful.fleet.serving import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    ReadyServer,
    server_config,
)
from wakeful.fleet.tokens import Authenticator, Caller
from wakeful.ids import check_id

log = logging.getLogger("wakeful.fleet.handserver")

MAX_BODY_BYTES = 2 * 1024 * 1024
HAND_TOKENS = "WAKEFUL_HAND_TOKENS"
"""The environment variable of the hand's tokens (``token=name,...``): not the API's
``WAKEFUL_TOKENS``, so a tenant's API token does not also run tools."""
PROBLEM = "application/problem+json"


class CallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operation_id: str = Field(max_length=200, description="The caller's idempotency key.")
    tool: str = Field(max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("operation_id", "tool")
    @classmethod
    def _check_id(cls, value: str, info: ValidationInfo) -> str:
        return check_id(str(info.field_name), value)


class CallResponse(BaseModel):
    operation_id: str
    tool: str
    status: str = Field(description="done | error | indeterminate")
    result: Any = None
    error: str | None = None
    replayed: bool = False


class _BodyTooLarge(Exception):
    pass


class _NotJson(Exception):
    pass


class HandGate:
    """Pure ASGI middleware: the Host and Origin rules (``wakeful.fleet.exposure``), then
    the bearer token of every ``/v1/`` route."""

    def __init__(self, app: Any, *, authenticator: Authenticator, exposure: Exposure) -> None:
        self.app = app
        self.authenticator = authenticator
        self.exposure = exposure

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refused = self._refusal(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Any) -> JSONResponse | None:
        headers = scope.get("headers", ())
        path = str(scope.get("path", ""))
        refused = self.exposure.refusal(str(scope.get("method", "")), headers, probe=path in PROBES)
        if refused is not None:
            return problem(refused.status, refused.slug, refused.title, refused.detail)
        if not path.startswith("/v1/"):
            return None
        authorization = next(
            (v.decode("latin-1") for n, v in headers if n == b"authorization"), None
        )
        caller = self.authenticator.resolve(authorization)
        if isinstance(caller, Caller):
            return None
        detail = "send Authorization: Bearer <token>"
        if caller == "invalid":
            detail = "the bearer token is not valid"
        answer = problem(401, "unauthenticated", "Unauthenticated", detail)
        answer.headers["WWW-Authenticate"] = "Bearer"
        return answer


def problem(status: int, slug: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": f"urn:wakeful:problem:{slug}", "title": title, "status": status}
    body["detail"] = detail
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(
    service: HandService,
    *,
    max_body: int = MAX_BODY_BYTES,
    tokens: Mapping[str, str] | None = None,
    allowed_hosts: Iterable[str] = (),
) -> FastAPI:
    """The hand's HTTP application. It does not close ``service``. ``tokens`` maps bearer
    tokens to names (the API's format; the names are not used); ``None`` or empty: no
    authentication, loopback Host names and ``allowed_hosts`` only (see the module
    docstring)."""
    authenticator = Authenticator(tokens)
    if authenticator.development:
        log.warning(
            "wakeful hand: NO TOKENS CONFIGURED - anyone who reaches it may run every tool "
            "and read every call. Configure WAKEFUL_HAND_TOKENS before exposing it."
        )
    app = FastAPI(title="wakeful hand", version="1", docs_url=None, redoc_url=None)
    exposure = Exposure(development=authenticator.development, allowed_hosts=allowed_hosts)
    app.add_middleware(HandGate, authenticator=authenticator, exposure=exposure)

    @app.post(
        "/v1/calls",
        response_model=CallResponse,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": CallRequest.model_json_schema()}},
            }
        },
    )
    async def post_call(request: Request) -> JSONResponse:
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise _NotJson
        call = CallRequest.model_validate_json(await _read_body(request, max_body))
        outcome = await service.execute(call.operation_id, call.tool, call.arguments)
        return JSONResponse(outcome.to_json())

    @app.get("/v1/calls/{operation_id}")
    async def get_call(operation_id: str) -> JSONResponse:
        record = await service.lookup(operation_id)
        if record is None:
            raise NotFound("operation", operation_id)
        return JSONResponse(record)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        await asyncio.to_thread(service.ledger.get, "healthz")
        return JSONResponse({"status": "ok"})

    @app.exception_handler(_BodyTooLarge)
    async def too_large(request: Request, exc: _BodyTooLarge) -> JSONResponse:
        return problem(413, "too-large", "Body too large", f"the limit is {max_body} bytes")

    @app.exception_handler(_NotJson)
    async def not_json(request: Request, exc: _NotJson) -> JSONResponse:
        return problem(
            415, "unsupported-media-type", "Unsupported media type", "send application/json"
        )

    @app.exception_handler(pydantic.ValidationError)
    async def invalid_body(request: Request, exc: pydantic.ValidationError) -> JSONResponse:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return problem(422, "invalid-input", "Invalid request", _summary(errors), errors=errors)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        return problem(422, "invalid-input", "Invalid request", _summary(errors), errors=errors)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return problem(exc.status_code, "http", str(exc.detail), str(exc.detail))

    @app.exception_handler(WakefulError)
    async def wakeful_error(request: Request, exc: WakefulError) -> JSONResponse:
        op = {"operation_id": exc.operation_id} if isinstance(exc, HandConflict) else {}
        if isinstance(exc, HandConflict):
            return problem(409, "operation-conflict", "Operation id reused", str(exc), **op)
        if isinstance(exc, UnknownTool):
            return problem(422, "unknown-tool", "Unknown tool", str(exc), tool=exc.tool)
        if isinstance(exc, InvalidInput):
            return problem(422, "invalid-input", "Invalid request", str(exc), field=exc.field)
        if isinstance(exc, NotFound):
            return problem(404, "not-found", "Not found", str(exc))
        if isinstance(exc, InvalidState):
            return problem(503, "unavailable", "Hand unavailable", str(exc))
        log.error("hand: %s: %s", type(exc).__name__, exc)
        return problem(500, "internal", "Hand failure", f"{type(exc).__name__}: {exc}")

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return problem(500, "internal", "Hand failure", type(exc).__name__)

    return app


def _summary(errors: Any) -> str:
    parts = []
    for error in list(errors)[:5]:
        loc = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{loc}: {error.get('msg')}" if loc else str(error.get("msg")))
    return "; ".join(parts) or "invalid request"


async def run_hand(
    ledger_path: str | Path,
    tools: Mapping[str, Callable[..., Any]],
    host: str = "127.0.0.1",
    port: int = 8700,
    *,
    on_ready: Callable[[str, int], None] | None = None,
    log_level: str = "info",
    tokens: Mapping[str, str] | None = None,
    allowed_hosts: Iterable[str] = (),
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Run the hand service until uvicorn stops (SIGINT / SIGTERM); ``on_ready(host, port)``
    is called once it listens (``port=0`` picks a free port). The ledger is closed after
    the running calls finish. ``tokens`` and ``allowed_hosts``: see ``create_app``;
    ``header_timeout`` and ``max_connections``: ``wakeful.fleet.serving.server_config``."""
    service = HandService(ledger_path, tools)
    try:
        app = create_app(service, tokens=tokens, allowed_hosts=allowed_hosts)
        config = server_config(
            app,
            host=host,
            port=port,
            header_timeout=header_timeout,
            max_connections=max_connections,
            log_level=log_level,
        )
        server = ReadyServer(config)
        serving = asyncio.create_task(server.serve())
        ready = asyncio.create_task(server.ready.wait())
        await asyncio.wait({serving, ready}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if server.started and on_ready is not None:
            on_ready(host, server.port)
        await serving
    finally:
        await service.aclose()


def serve_hand(
    ledger_path: str | Path,
    tools: Mapping[str, Callable[..., Any]],
    host: str = "127.0.0.1",
    port: int = 8700,
    *,
    on_ready: Callable[[str, int], None] | None = None,
    log_level: str = "info",
    tokens: Mapping[str, str] | None = None,
    allowed_hosts: Iterable[str] = (),
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Blocking: run the hand service in a fresh event loop (``wakeful hand serve``)."""
    asyncio.run(
        run_hand(
            ledger_path,
            tools,
            host,
            port,
            on_ready=on_ready,
            log_level=log_level,
            tokens=tokens,
            allowed_hosts=allowed_hosts,
            header_timeout=header_timeout,
            max_connections=max_connections,
        )
    )
