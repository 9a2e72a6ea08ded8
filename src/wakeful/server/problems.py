"""RFC 7807 problem documents and the one place where errors become HTTP statuses.

| error | status |
| --- | --- |
| ``NotFound``, ``TenantMismatch`` (reported exactly like a missing thread) | 404 |
| ``ThreadBusy``, ``InvalidState``, ``DispatchConflict``, ``OperationConflict``, ``VersionConflict``, ``StaleClaim``, ``RunInProgress``, ``NotSuspended``, ``UnknownTicket``, ``WorkerSuperseded``, ``ScheduleContended``, ``GraphChanged`` | 409 |
| ``ReplayUnavailable`` | 410 (with ``earliest_seq``) |
| ``InvalidInput``, request validation | 422 (with ``field``) |
| ``StoreUnavailable``, ``StoreClosed`` | 503 (with ``Retry-After``) |
| anything else | 500, generic detail; the error is logged with an ``error_id`` |
"""  # noqa: E501

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

import fastapi.routing
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from wakeful.errors import (
    DispatchConflict,
    GraphChanged,
    InvalidInput,
    InvalidState,
    NotFound,
    NotSuspended,
    OperationConflict,
    ReplayUnavailable,
    RunInProgress,
    ScheduleContended,
    StaleClaim,
    StoreClosed,
    StoreUnavailable,
    TenantMismatch,
    ThreadBusy,
    UnknownTicket,
    VersionConflict,
    WakefulError,
    WorkerSuperseded,
)

log = logging.getLogger("wakeful.server")

MEDIA_TYPE = "application/problem+json"


class Forbidden(Exception):
    """A valid token without the role the route needs."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class ProblemResponse(JSONResponse):
    media_type = MEDIA_TYPE


def problem(
    status: int,
    slug: str,
    detail: str,
    *,
    title: str | None = None,
    instance: str | None = None,
    headers: Mapping[str, str] | None = None,
    **fields: Any,
) -> ProblemResponse:
    """A problem document response. ``fields`` are the domain fields."""
    body: dict[str, Any] = {
        "type": f"urn:wakeful:problem:{slug}",
        "title": title or _phrase(status),
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    body.update(fields)
    return ProblemResponse(body, status_code=status, headers=dict(headers or {}))


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _conflict(exc: WakefulError) -> tuple[str, str, dict[str, Any]]:
    if isinstance(exc, ThreadBusy):
        busy: dict[str, Any] = {"thread_id": exc.thread_id}
        if exc.dispatch_id is not None:  # a submission with if_busy="reject"
            busy.update(run_id=exc.run_id, dispatch_id=exc.dispatch_id)
        return "thread-busy", "Thread busy", busy
    if isinstance(exc, DispatchConflict):
        return "dispatch-conflict", "Idempotency conflict", {"dispatch_id": exc.dispatch_id}
    if isinstance(exc, OperationConflict):
        return "operation-conflict", "Operation conflict", {"operation_id": exc.operation_id}
    if isinstance(exc, VersionConflict):
        return "version-conflict", "Version conflict", {"thread_id": exc.thread_id}
    if isinstance(exc, StaleClaim):
        return "stale-claim", "Stale claim", {"thread_id": exc.thread_id}
    if isinstance(exc, NotSuspended):
        return "not-suspended", "Run not suspended", {"thread_id": exc.thread_id}
    if isinstance(exc, RunInProgress):
        return "run-in-progress", "Run in progress", {"thread_id": exc.thread_id}
    if isinstance(exc, InvalidState):
        return "invalid-state", "Invalid state", {"state": exc.state}
    if isinstance(exc, GraphChanged):
        return "graph-changed", "Graph changed", {"thread_id": exc.thread_id}
    return "conflict", "Conflict", {}


_CONFLICTS = (
    ThreadBusy,
    InvalidState,
    DispatchConflict,
    OperationConflict,
    VersionConflict,
    StaleClaim,
    RunInProgress,
    NotSuspended,
    WorkerSuperseded,
    ScheduleContended,
    GraphChanged,
)


def problem_for(exc: BaseException, instance: str | None = None) -> ProblemResponse:
    """The problem document for ``exc``: the one mapping from errors to statuses."""
    if isinstance(exc, TenantMismatch):
        # Exactly what a missing thread looks like: nothing about the other tenant leaks.
        missing = NotFound("thread", exc.thread_id)
        return problem(404, "not-found", str(missing), instance=instance)
    if isinstance(exc, NotFound):
        return problem(404, "not-found", str(exc), instance=instance)
    if isinstance(exc, _CONFLICTS):
        slug, title, fields = _conflict(exc)
        return problem(409, slug, str(exc), title=title, instance=instance, **fields)
    if isinstance(exc, ReplayUnavailable):
        return problem(
            410,
            "replay-unavailable",
            str(exc),
            title="Events compacted",
            instance=instance,
            thread_id=exc.thread_id,
            after_seq=exc.after_seq,
            earliest_seq=exc.earliest_seq,
        )
    if isinstance(exc, InvalidInput):
        return problem(422, "invalid-input", str(exc), instance=instance, field=exc.field)
    if isinstance(exc, UnknownTicket):
        # 409, not 422: which tickets are open is the thread's state, not the body's shape
        return problem(
            409,
            "unknown-ticket",
            str(exc),
            title="Unknown ticket",
            instance=instance,
            field="answers",
            tickets=exc.tickets,
        )
    if isinstance(exc, StoreUnavailable | StoreClosed):
        return problem(
            503,
            "store-unavailable",
            str(exc),
            title="Store unavailable",
            instance=instance,
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, Forbidden):
        return problem(403, "forbidden", exc.detail, instance=instance)
    error_id = uuid.uuid4().hex
    log.error("internal error %s", error_id, exc_info=(type(exc), exc, exc.__traceback__))
    return problem(
        500,
        "internal",
        f"an internal error occurred; it was logged with id {error_id}",
        instance=instance,
        error_id=error_id,
    )


def validation_problem(errors: Sequence[Any], instance: str | None) -> ProblemResponse:
    """422 for a request that did not validate: every error with its location, and
    ``field`` naming the first offending field."""
    cleaned = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg")), "type": e.get("type")}
        for e in errors
    ]
    first = cleaned[0]["loc"] if cleaned else []
    field = ".".join(first[1:]) or ".".join(first) or "request"
    if cleaned and cleaned[0]["type"] == "json_invalid":
        field = "body"  # its location is a character position, not a field
    summary = "; ".join(
        f"{'.'.join(e['loc'][1:]) or '.'.join(e['loc'])}: {e['msg']}" for e in cleaned[:5]
    )
    return problem(
        422,
        "invalid-input",
        summary or "invalid request",
        title="Invalid request",
        instance=instance,
        field=field,
        errors=cleaned,
    )


async def _wakeful_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, StaleClaim):
        request.app.state.wakeful.metrics.stale_claims.inc()
    return problem_for(exc, request.url.path)


async def _forbidden(request: Request, exc: Exception) -> Response:
    return problem_for(exc, request.url.path)


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return validation_problem(exc.errors(), request.url.path)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    slug = _phrase(exc.status_code).lower().replace(" ", "-")
    detail = exc.detail if isinstance(exc.detail, str) else _phrase(exc.status_code)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    return problem(exc.status_code, slug, detail, instance=request.url.path, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path. (Starlette's 405 names only
    the first route matching the path, so ``GET`` and ``DELETE`` on one path disagreed.)"""
    methods: set[str] = set()
    probe = {**request.scope, "method": "\x00"}  # no route serves it: a path match is PARTIAL
    for route in _flat_routes(request.app.router.routes):
        match, _ = route.matches(probe)
        if match is Match.PARTIAL:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def _flat_routes(routes: Sequence[Any]) -> Iterable[Any]:
    """The routes with their full paths. FastAPI 0.165 keeps an included router as one
    ``_IncludedRouter`` entry (it has no ``methods``) and flattens it with
    ``iter_route_contexts``; older versions copied every route into ``app.router.routes``."""
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    return routes if flatten is None else flatten(routes)


Handler = Callable[[Request, Any], Coroutine[Any, Any, Response]]

HANDLERS: dict[int | type[Exception], Handler] = {
    WakefulError: _wakeful_error,
    Forbidden: _forbidden,
    RequestValidationError: _invalid_request,
    HTTPException: _http_error,
}
"""Exception handlers for ``FastAPI(exception_handlers=...)``. Errors no handler takes reach
the gateway middleware, which answers a generic 500 problem."""


__all__ = [
    "HANDLERS",
    "MEDIA_TYPE",
    "Forbidden",
    "ProblemResponse",
    "problem",
    "problem_for",
    "validation_problem",
]
