"""The application factory: ``create_app(store, registry, tokens)``.

The app does not own the store (the caller opens and closes it). See ``docs/http-api.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Security
from fastapi.openapi.utils import get_openapi
from fastapi.security import HTTPBearer

from wakeful.fleet.exposure import Exposure
from wakeful.fleet.live import LiveChannel
from wakeful.fleet.registry import Registry
from wakeful.fleet.wake import Wake
from wakeful.metrics import Metrics
from wakeful.redact import install_redaction
from wakeful.server import apidocs, console
from wakeful.server.access import ServerState
from wakeful.server.auth import Authenticator
from wakeful.server.feeds import Feeds
from wakeful.server.gateway import PROTECTED_PREFIX, Gateway
from wakeful.server.problems import HANDLERS, MEDIA_TYPE
from wakeful.server.routes import (
    events,
    health,
    limits,
    operators,
    runs,
    schedules,
    session,
    stream,
    threads,
    travel,
    versions,
    webhooks,
)
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.server")

DEFAULT_MAX_BODY = 1_048_576
DEFAULT_BODY_TIMEOUT = 30.0
"""Seconds a request's whole body may take to arrive before it is answered 408 and the
connection closed (a client that declares a body and stops sending would hold it forever).
30 s lets a 1 MiB body through at ~35 KB/s."""
PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

DESCRIPTION = """\
The HTTP API of wakeful: submit, resume and cancel runs; read threads, messages, runs and
events (JSON pages, or Server-Sent Events resumable with `Last-Event-ID`); list workers and
dispatches; and the operator routes for quarantined work. A web console is served at
`/console`.

Routes under `/v1` need `Authorization: Bearer <token>`; a token maps to a tenant, and a
thread of another tenant is reported as missing (404). Tokens of tenant `*` are operators.
With no token configured the server runs in **development mode**: every request is an
operator without a tenant, and only loopback Host names are answered (421 otherwise). In
every mode a `POST`, `PUT`, `PATCH` or `DELETE` sent from another web origin is refused (403).
Errors are RFC 7807 problem documents (`application/problem+json`).
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
    """Every status a route answers is documented: the gateway's (401 under ``/v1``; 408,
    413 and 422 for a body), the store's 503, each as a problem document."""
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            for parameter in op.get("parameters", ()):
                _drop_null(parameter)
            if path.startswith(PROTECTED_PREFIX):
                responses.setdefault("401", {"description": "Missing or unknown bearer token."})
                responses.setdefault("503", {"description": "The store is unavailable; retry."})
            if method in ("post", "put", "patch"):
                responses.setdefault("408", {"description": "The body did not arrive in time."})
                responses.setdefault("413", {"description": "The request body is too large."})
                responses.setdefault("422", {"description": ""})
            if "422" in responses:
                responses["422"]["description"] = "Invalid input; the problem names the `field`."
            for code, response in responses.items():
                if code.isdigit() and int(code) >= 400:
                    response["content"] = {MEDIA_TYPE: {"schema": PROBLEM_REF}}
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


def _drop_null(parameter: dict[str, Any]) -> None:
    """An optional path, query or header parameter is absent or a value: it is never JSON
    ``null``, so the schema does not offer ``null`` (a client sending the text ``null``
    would be refused)."""
    schema = parameter.get("schema", {})
    options = schema.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options:
        kept = [o for o in options if o != {"type": "null"}]
        del schema["anyOf"]
        if len(kept) == 1:
            schema.update(kept[0])
        else:
            schema["anyOf"] = kept


def create_app(
    store: Store,
    registry: Registry | None = None,
    tokens: Mapping[str, str] | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    wake: Wake | None = None,
    metrics: Metrics | None = None,
    sse_keepalive: float = 15.0,
    stream_max_seconds: float | None = None,
    queue_depth_bound: int = 10_000,
    live: LiveChannel | None = None,
    stream_poll_interval: float = 0.025,
    allowed_hosts: Iterable[str] = (),
    langgraph_runs: str = "server",
) -> FastAPI:
    """The HTTP API over ``store``.

    ``tokens`` maps bearer tokens to tenants (``"*"``: operator); ``None`` or empty is
    **development mode**, where every request is an operator without a tenant. ``registry``
    (optional) rejects unknown targets with 422. ``wake`` is notified after work is
    submitted. ``metrics`` is shared with a worker in the same process if given.
    ``body_timeout``: seconds a request body may take to arrive (then 408).
    ``sse_keepalive`` is the idle interval between keep-alive comments of an event stream;
    ``stream_max_seconds`` ends streams after that long (clients resume with
    ``Last-Event-ID``); ``queue_depth_bound`` bounds the dispatches counted per status when
    ``/metrics`` is scraped. ``live`` is the channel workers publish model deltas on
    (``wakeful.fleet.live``; the caller opens and closes it); without one, ``messages``
    streams follow the runs' stream checkpoints, read every ``stream_poll_interval``
    seconds while a client streams a running thread.

    Browsers are kept out (``wakeful.fleet.exposure``): without tokens the server answers
    only loopback Host names and ``allowed_hosts`` (421 otherwise: DNS rebinding), and in
    every mode a ``POST``/``PUT``/``PATCH``/``DELETE`` whose ``Origin`` is another site's is
    refused 403. ``allowed_hosts`` (names, ``"*"`` for any) also counts as the server's own
    origin; with tokens, naming any turns the Host check on.

    ``langgraph_runs``: who runs the runs of the LangGraph API at ``/langgraph`` (mounted
    when ``registry`` has LangGraph graphs): ``server`` (this process) or ``workers`` (the
    fleet: runs are dispatches, streamed through ``live``; decision 0052)."""
    if max_body_bytes < 1:
        raise ValueError("max_body_bytes must be positive")
    if sse_keepalive <= 0:
        raise ValueError("sse_keepalive must be positive")
    if not body_timeout > 0:
        raise ValueError("body_timeout must be positive")
    if langgraph_runs not in ("server", "workers"):
        raise ValueError("langgraph_runs must be 'server' or 'workers'")
    install_redaction()
    authenticator = Authenticator(tokens)
    exposure = Exposure(development=authenticator.development, allowed_hosts=allowed_hosts)
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
        docs_url=None,  # FastAPI's page loads Swagger UI from a CDN: apidocs serves one offline
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
        travel.router,
        events.router,
        stream.router,
        operators.router,
        operators.operators,
        limits.router,
        schedules.router,
        session.router,
        versions.router,
        webhooks.router,
    ):
        app.include_router(router, dependencies=secured)
    if registry is not None and registry.langgraphs:
        from wakeful.server.langgraph_api import create_langgraph_app
        from wakeful.server.langgraph_runs import LangGraphFleet

        closing = app.state.wakeful.closing  # set at shutdown: waiting requests end
        fleet = LangGraphFleet(live, wake, closing=closing) if langgraph_runs == "workers" else None
        lg_app = create_langgraph_app(store, registry.langgraphs, tokens, fleet)
        app.mount("/langgraph", lg_app)
    app.include_router(health.router)
    app.include_router(apidocs.router)
    app.include_router(console.router)
    app.add_middleware(
        Gateway,
        authenticator=authenticator,
        metrics=counters,
        max_body_bytes=max_body_bytes,
        body_timeout=body_timeout,
        templates=lambda: list(app.openapi().get("paths", {})),
        exposure=exposure,
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
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_MAX_BODY",
    "WakefulAPI",
    "close_feeds",
    "close_streams",
    "create_app",
    "open_streams",
]
