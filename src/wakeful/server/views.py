"""Records to HTTP views, and the OpenAPI description of error responses."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from wakeful.records import Dispatch
from wakeful.runtime.sleeps import wake_at
from wakeful.server.access import Owner, json_field
from wakeful.server.problems import MEDIA_TYPE
from wakeful.server.schemas import Accepted, ClaimView, DispatchView, Problem, ThreadView

_DESCRIPTIONS = {
    401: "Missing or unknown bearer token.",
    403: "The token lacks the operator role.",
    404: "Not found (also: it belongs to another tenant).",
    409: "Conflict with the current state (idempotency key reused with another body, ...).",
    410: "Events below the compaction floor; the problem names `earliest_seq`.",
    413: "The request body is too large.",
    422: "Invalid input; the problem names the `field`.",
    503: "The store is unavailable; retry.",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for problem documents with these statuses (401 and 422 are
    added to every route under ``/v1`` and with parameters)."""
    return {
        code: {
            "model": Problem,
            "description": _DESCRIPTIONS[code],
            "content": {MEDIA_TYPE: {}},
        }
        for code in codes
    }


def dispatch_view(d: Dispatch) -> DispatchView:
    view = DispatchView.model_validate(d, from_attributes=True)
    view.not_before = not_before(d)
    return view


def not_before(d: Dispatch) -> datetime | None:
    """When work waits for a time (``scheduled``: a delayed run, a retry's backoff, a
    sleeping run's wake-up, a debounced submission): its ``available_at``; ``None`` for work
    claimable since it was stored or no longer waiting. (A ``pending`` dispatch with a later
    ``available_at`` is one stored before the ``scheduled`` status, in a file store's log.)"""
    at, created = d.available_at, d.created_at
    if d.status == "scheduled":
        return at
    if d.status != "pending" or at is None or created is None or at <= created:
        return None
    return at


def accepted(d: Dispatch, run_id: str | None, message_id: str | None = None) -> Accepted:
    return Accepted(
        dispatch_id=d.dispatch_id,
        thread_id=d.thread_id,
        kind=d.kind,
        status=d.status,
        run_id=run_id,
        message_id=message_id,
        not_before=not_before(d),
        queued_behind=d.queued_behind,
    )


def thread_view(owner: Owner) -> ThreadView:
    snap = owner.snapshot
    cp = snap.checkpoint if snap is not None else None
    tickets: list[dict[str, Any]] = []
    if cp is not None and cp.status == "suspended":
        raw = cp.metadata.get("tickets", [])
        tickets = [t for t in raw if isinstance(t, dict)] if isinstance(raw, list) else []
    graph = json_field(cp.metadata, "graph") if cp is not None else None
    claim = snap.claim if snap is not None else None
    waking = wake_at(cp)
    return ThreadView(
        thread_id=owner.thread_id,
        tenant=owner.tenant,
        version=snap.version if snap is not None else 0,
        status="sleeping" if waking is not None else cp.status if cp is not None else None,
        wake_at=waking,
        run_id=cp.run_id if cp is not None else None,
        checkpoint_id=cp.id if cp is not None else None,
        graph=graph if isinstance(graph, str) else None,
        updated_at=cp.created_at if cp is not None else None,
        claim=ClaimView.model_validate(claim, from_attributes=True) if claim else None,
        state=cp.state if cp is not None else None,
        message_count=snap.message_count if snap is not None else 0,
        last_seq=snap.last_seq if snap is not None else 0,
        event_floor=snap.event_floor if snap is not None else 1,
        tickets=tickets,
    )


__all__ = ["accepted", "dispatch_view", "errors", "not_before", "thread_view"]
