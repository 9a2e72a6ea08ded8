"""Problem documents (RFC 7807) back into the library's exception classes.

The server answers every error with ``application/problem+json`` whose ``type`` ends in a
slug (``docs/http-api.md``). Each slug maps to the class the library raises for the same
condition, so ``except ThreadBusy`` works the same over HTTP as in process. The exception's
message is the server's ``detail``; its fields are set from the document's extra fields
(a field the document does not carry is ``None``), and ``problem`` keeps the whole document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wakeful.errors import (
    DispatchConflict,
    GraphChanged,
    InvalidInput,
    InvalidState,
    NotFound,
    NotSuspended,
    OperationConflict,
    ReplayUnavailable,
    RequestRefused,
    RunInProgress,
    StaleClaim,
    StoreUnavailable,
    ThreadBusy,
    UnknownTicket,
    VersionConflict,
    WakefulError,
)

PREFIX = "urn:wakeful:problem:"


def _fields(doc: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: doc.get(name) for name in names}


_BUILD: dict[str, tuple[type[WakefulError], Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "not-found": (NotFound, lambda d: {"what": None, "ident": d.get("instance")}),
    "thread-busy": (
        ThreadBusy,
        lambda d: {
            **_fields(d, "thread_id", "run_id", "dispatch_id"),
            "holder": None,
            "checkpoint_id": None,
        },
    ),
    "dispatch-conflict": (
        DispatchConflict,
        lambda d: {
            **_fields(d, "dispatch_id"),
            "existing_id": d.get("dispatch_id"),
            "key": "Idempotency-Key",
        },
    ),
    "operation-conflict": (OperationConflict, lambda d: _fields(d, "operation_id", "thread_id")),
    "version-conflict": (VersionConflict, lambda d: _fields(d, "thread_id")),
    "stale-claim": (StaleClaim, lambda d: _fields(d, "thread_id")),
    "not-suspended": (NotSuspended, lambda d: {**_fields(d, "thread_id"), "status": None}),
    "run-in-progress": (RunInProgress, lambda d: _fields(d, "thread_id")),
    "invalid-state": (InvalidState, lambda d: _fields(d, "state")),
    "graph-changed": (
        GraphChanged,
        lambda d: {**_fields(d, "thread_id"), "recorded": None, "current": None},
    ),
    "replay-unavailable": (
        ReplayUnavailable,
        lambda d: _fields(d, "thread_id", "after_seq", "earliest_seq"),
    ),
    "invalid-input": (
        InvalidInput,
        lambda d: {**_fields(d, "field", "errors"), "problem": d.get("detail")},
    ),
    "unknown-ticket": (UnknownTicket, lambda d: _fields(d, "tickets", "field")),
    "store-unavailable": (StoreUnavailable, lambda d: {"detail": d.get("detail")}),
}


def error_for(status: int, doc: Any) -> WakefulError:
    """The exception a problem document (or any error answer) stands for."""
    if not isinstance(doc, dict):
        doc = {"status": status, "detail": str(doc)[:500] if doc else None}
    slug = str(doc.get("type", "")).removeprefix(PREFIX)
    built = _BUILD.get(slug)
    if built is None:
        return RequestRefused(status, doc)
    cls, fields = built
    exc = cls.__new__(cls)
    Exception.__init__(exc, str(doc.get("detail") or doc.get("title") or slug))
    for name, value in fields(doc).items():
        setattr(exc, name, value)
    exc.problem = doc  # type: ignore[attr-defined]
    exc.status = status  # type: ignore[attr-defined]
    return exc


__all__ = ["error_for"]
