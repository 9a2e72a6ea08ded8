"""What the worker knows about one dispatch attempt: whose run the thread's latest
checkpoint is, whether the thread belongs to another tenant, the settle folded into an
ending commit, and the structured fields of its log lines."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from wakeful.errors import WakefulError
from wakeful.records import (
    Checkpoint,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    Message,
    Outcome,
    Settle,
    ThreadSnapshot,
)
from wakeful.runtime.webhooks import is_webhook_thread
from wakeful.store.contract import Store

UNFINISHED = ("running", "suspended")
"""The run statuses that hold a thread: its work is not over."""
CANCELLED = "cancelled: "
"""How every store's ``cancel`` marks the open dispatches it retires (``last_error``)."""


def foreign_tenant(snap: ThreadSnapshot, tenant: str) -> bool:
    return snap.tenant_bound and snap.tenant != tenant


def terminal_checkpoint(
    latest: Checkpoint | None,
    status: Any,
    ended_by: str,
    now: datetime,
    metadata: dict[str, Any] | None = None,
) -> Checkpoint | None:
    """The checkpoint that ends the thread's unfinished run with ``status`` (its state and
    frontier kept, ``metadata`` merged into its own, ``metadata["ended_by"]`` the event that
    ended it), or ``None`` when the latest checkpoint's run is already finished (or there is
    none)."""
    if latest is None or latest.status not in UNFINISHED:
        return None
    ordinal = int(latest.metadata.get("ordinal", 0)) + 1
    return Checkpoint(
        id=f"{latest.run_id}-c{ordinal}",
        parent=latest.id,
        run_id=latest.run_id,
        status=status,
        state=latest.state,
        created_at=now,
        tenant=latest.tenant,
        frontier=list(latest.frontier),
        metadata={**latest.metadata, **(metadata or {}), "ordinal": ordinal, "ended_by": ended_by},
    )


@dataclass(frozen=True)
class Settled:
    """An outcome already recorded by the commit that ended the work; ``wake_at``: the run
    fell asleep (the commit settled its dispatch due again then)."""

    outcome: Outcome
    wake_at: datetime | None = None


def log_fields(d: Dispatch) -> dict[str, Any]:
    """The structured fields of a dispatch's log lines (``--log-format json``)."""
    payload = d.payload if isinstance(d.payload, dict) else {}
    return {
        "dispatch_id": d.dispatch_id,
        "thread_id": d.thread_id,
        "kind": d.kind,
        "target": str(payload.get("target") or d.kind),
        "attempt": d.attempts,
        "max_attempts": d.max_attempts,
    }


def log_end(
    log: logging.Logger,
    d: Dispatch,
    fields: dict[str, Any],
    started: float,
    outcome: str,
    reason: str | None,
) -> None:
    """The line that closes a dispatch attempt (``started``: ``time.monotonic()`` when it
    began; ``fields``: ``log_fields(d)``, or empty to have them built here). Nothing is
    built when INFO is off: a worker writes one per dispatch."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields = fields or log_fields(d)
    duration = time.monotonic() - started
    log.info(
        "dispatch %s ended %s in %.3f s%s",
        d.dispatch_id,
        outcome,
        duration,
        f": {reason}" if reason else "",
        extra={**fields, "outcome": outcome, "reason": reason, "duration": round(duration, 6)},
    )


def next_step(d: Dispatch, delay: float) -> str:
    """What follows a failed attempt, for its log line: another attempt, or (none left) the
    run recorded indeterminate once ``delay`` has passed, unless an operator quarantines the
    dispatch first (docs/operations.md). A webhook delivery's budget is time, not attempts
    (``wakeful.fleet.webhooks``): it is retried whatever ``max_attempts`` says."""
    if d.attempts < d.max_attempts or is_webhook_thread(d.thread_id):
        return f"retrying in {delay:.1f} s"
    return (
        f"no attempt left; its run is recorded indeterminate in {delay:.1f} s unless it is "
        f"quarantined first (wakeful quarantine add {d.dispatch_id})"
    )


async def fenced_ending(store: Store, dispatch_id: str, otherwise: str) -> tuple[str, str]:
    """How an attempt whose claim was taken ended, for its log line: ``cancelled`` when a
    cancel retired the dispatch (it took the thread's claim), else ``fenced`` (a newer
    owner took it over: ``otherwise`` says how). Read only on this rare path; a failed read
    says ``fenced``."""
    try:
        found = await store.get_dispatch(dispatch_id)
    except WakefulError:
        found = None
    error = found.last_error if found is not None else None
    if error is not None and error.startswith(CANCELLED):
        return "cancelled", f"the run was cancelled ({error[len(CANCELLED) :]})"
    return "fenced", otherwise


def settle_done(dispatch_id: str | None) -> Settle | None:
    return None if dispatch_id is None else Settle(dispatch_id=dispatch_id, outcome=Done())


def ending_commit(
    token: int,
    latest: Checkpoint | None,
    status: Any,
    event_type: str,
    data: dict[str, Any],
    now: datetime,
    *,
    operation_id: str | None = None,
    settle: str | None = None,
    messages: tuple[Message, ...] = (),
    metadata: dict[str, Any] | None = None,
) -> Commit:
    """The commit that records a terminal ``status`` for the thread's unfinished run (if
    ``latest`` is one: a checkpoint ``ended_by`` ``event_type``, ``metadata`` merged into
    its own, with ``messages``) and the event, under claim ``token``. Idempotent by the
    ending checkpoint's id, else by ``operation_id``; ``settle``: settled ``Done`` by it."""
    checkpoint = terminal_checkpoint(latest, status, event_type, now, metadata)
    return Commit(
        token=token,
        checkpoint=checkpoint,
        events=(EventDraft(type=event_type, data=data, run_id=latest.run_id if latest else None),),
        messages=messages if checkpoint else (),
        operation_id=f"{checkpoint.id}:end" if checkpoint else operation_id,
        settle=settle_done(settle),
    )


def run_of(
    dispatch_id: str, kind: str, payload: dict[str, Any], latest: Checkpoint | None
) -> Checkpoint | None:
    """The thread's latest checkpoint when it belongs to this dispatch's run: started by it
    (same run id) or resumed by it."""
    if latest is None:
        return None
    if kind in ("start", "message") and latest.run_id == (
        payload.get("run_id") or f"run-{dispatch_id}"
    ):
        return latest
    if kind == "resume" and latest.metadata.get("resumed_by") == dispatch_id:
        return latest
    return None


__all__ = [
    "Settled",
    "fenced_ending",
    "foreign_tenant",
    "log_end",
    "log_fields",
    "next_step",
    "run_of",
    "settle_done",
]
