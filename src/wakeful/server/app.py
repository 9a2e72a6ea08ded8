"""The application factory: ``create_app(store, registry, tokens)``.

The app does not own the store (the caller opens and closes it). See ``docs/http-api.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Security
from fastapi.openapi.utils import get_openapi
from fastapi.security import HTTPBearer

from wakeful.fleet.live import LiveChannel
from wakeful.fleet.registry import Registry
from wakeful.fleet.wake import Wake
from wakeful.metrics import Metrics
from wakeful.server.access import ServerState
from wakeful.server.auth import Authenticator
from wakeful.server.feeds import Feeds
from wakeful.server.gateway import PROTECTED_PREFIX, Gateway
from wakeful.server.problems import HANDLERS, MEDIA_TYPE
from wakeful.server.routes import events, health, operators, runs, stream, threads
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.server")

DEFAULT_MAX_BODY = 1_048_576
PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

DESCRIPTION = """\
The HTTP API of wakeful: submit, resume and cancel runs; read threads, messages, runs and
events (JSON pages, or Server-Sent Events resumable with `Last-Event-ID`); list workers and
dispatches; and the operator routes for quarantined work.

Routes under `/v1` need `Authorization: Bearer <token>`; a token maps to a tenant, and a
thread of another tenant is reported as missing (404). Tokens of tenant `*` are operators.
With no token configured the server runs in **development mode**: every request is an
operator without a tenant. Errors are RFC 7807 problem documents (`application/problem+json`).
"""

bearer = HTTPBearer(
    auto_error=False,
    description="A token of the server's token table (`WAKEFUL_TOKENS` or a JSON file).",
)


class WakefulAPI(FastAPI):
    """FastAPI whose OpenAPI document describes every error as a problem document."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema:
            return self.openapi_schema
        schema = get_openapi(
            title=self.title,
            version=self.version,
            description=self.description,
            routes=self.routes,
        )
        _describe_problems(schema)
        self.openapi_schema = schema
        return schema


def _describe_problems(schema: dict[str, Any]) -> None:
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            if path.startswith(PROTECTED_PREFIX):
                responses.setdefault("401", {"description": "Missing or unknown bearer token."})
            if method in ("post", "put", "patch"):
                responses.setdefault("413", {"description": "The request body is too large."})
            if "422" in responses:
                responses["422"]["description"] = "Invalid input; the problem names the `field`."
            for code, response in responses.items():
                if code.isdigit() and int(code) >= 400:
                    response["content"] = {MEDIA_TYPE: {"schema": PROBLEM_REF}}
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


def create_app(
    store: Store,
    registry: Registry | None = None,
    tokens: Mapping[str, str] | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    wake: Wake | None = None,
    metrics: Metrics | None = None,
    sse_keepalive: float = 15.0,
    stream_max_seconds: float | None = None,
    queue_depth_bound: int = 10_000,
    live: LiveChannel | None = None,
    stream_poll_interval: float = 0.025,
) -> FastAPI:
    """The HTTP API over ``store``.

    ``tokens`` maps bearer tokens to tenants (``"*"``: operator); ``None`` or empty is
    **development mode**, where every request is an operator without a tenant. ``registry``
    (optional) rejects unknown targets with 422. ``wake`` is notified after work is
    submitted. ``metrics`` is shared with a worker in the same process if given.
    ``sse_keepalive`` is the idle interval between keep-alive comments of an event stream;
    ``stream_max_seconds`` ends streams after that long (clients resume with
    ``Last-Event-ID``); ``queue_depth_bound`` bounds the dispatches counted per status when
    ``/metrics`` is scraped. ``live`` is the channel workers publish model deltas on
    (``wakeful.fleet.live``; the caller opens and closes it); without one, ``messages``
    streams follow the runs' stream checkpoints, read every ``stream_poll_interval``
    seconds while a client streams a running thread."""
    if max_body_bytes < 1:
        raise ValueError("max_body_bytes must be positive")
    if sse_keepalive <= 0:
        raise ValueError("sse_keepalive must be positive")
    authenticator = Authenticator(tokens)
    if authenticator.development:
        log.warning(
            "wakeful server: NO TOKENS CONFIGURED - development mode: every request is an "
            "operator without a tenant. Configure WAKEFUL_TOKENS before exposing this server."
        )
    counters = metrics if metrics is not None else Metrics()
    app = WakefulAPI(
        title="wakeful",
        version="1",
        description=DESCRIPTION,
        docs_url="/docs",
        redoc_url=None,
        exception_handlers=dict(HANDLERS),
    )
    app.state.wakeful = ServerState(
        store=store,
        registry=registry,
        wake=wake,
        metrics=counters,
        development=authenticator.development,
        sse_keepalive=sse_keepalive,
        stream_max_seconds=stream_max_seconds,
        queue_depth_bound=queue_depth_bound,
        feeds=Feeds(store, live, poll_interval=stream_poll_interval),
    )
    secured = [Security(bearer)]
    for router in (
        runs.router,
        threads.router,
        events.router,
        stream.router,
        operators.router,
        operators.operators,
    ):
        app.include_router(router, dependencies=secured)
    app.include_router(health.router)
    app.add_middleware(
        Gateway,
        authenticator=authenticator,
        metrics=counters,
        max_body_bytes=max_body_bytes,
        templates=lambda: list(app.openapi().get("paths", {})),
    )
    return app


def close_streams(app: Any) -> None:
    """End the app's open event streams (the server is shutting down)."""
    state = getattr(getattr(app, "state", None), "wakeful", None)
    if isinstance(state, ServerState):
        state.closing.set()


async def close_feeds(app: Any) -> None:
    """Stop the app's thread followers (after its streams ended)."""
    state = getattr(getattr(app, "state", None), "wakeful", None)
    if isinstance(state, ServerState) and isinstance(state.feeds, Feeds):
        await state.feeds.close()


def open_streams(app: Any) -> None:
    """Let the app stream again (a server starts serving it, maybe after a shutdown)."""
    state = getattr(getattr(app, "state", None), "wakeful", None)
    if isinstance(state, ServerState):
        state.closing.clear()


__all__ = [
    "DEFAULT_MAX_BODY",
    "WakefulAPI",
    "close_feeds",
    "close_streams",
    "create_app",
    "open_streams",
]
