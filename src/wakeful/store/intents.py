"""The cancel intents every store builds (``cancel``, and the fence an ``interrupt`` or
``rollback`` submission makes of the busy run), and the run id of a run's dispatch."""

from __future__ import annotations

import uuid
from datetime import datetime

from wakeful.records import Dispatch
from wakeful.store.kinds import CANCEL_PRIORITY
from wakeful.store.validate_queue import RUN_KINDS


def cancel_intent(
    thread_id: str,
    reason: str,
    now: datetime,
    interrupted_by: str | None = None,
    rollback: bool = False,
) -> Dispatch:
    """The ``cancel`` dispatch that ``cancel`` persists (every store builds it here); with
    ``interrupted_by``, the one an ``if_busy="interrupt"`` submission makes: its claimant
    ends the busy run ``interrupted`` rather than ``cancelled``; with ``rollback`` too
    (``if_busy="rollback"``), its claimant also undoes what the run committed."""
    payload: dict[str, str | bool] = {"reason": reason}
    if interrupted_by is not None:
        payload["interrupted_by"] = interrupted_by
        if rollback:
            payload["rollback"] = True
    return Dispatch(
        dispatch_id=f"cancel-{uuid.uuid4().hex}",
        thread_id=thread_id,
        kind="cancel",
        payload=payload,
        priority=CANCEL_PRIORITY,
        available_at=now,
        created_at=now,
        updated_at=now,
    )


def run_id_of(d: Dispatch) -> str | None:
    """The run a ``start`` or ``message`` dispatch starts: as its payload names it, else
    ``run-<dispatch_id>`` (as the worker names it); ``None`` for other kinds."""
    if d.kind not in RUN_KINDS:
        return None
    payload = d.payload if isinstance(d.payload, dict) else {}
    named = payload.get("run_id")
    return named if isinstance(named, str) else f"run-{d.dispatch_id}"


def interrupt_reason(dispatch_id: str, if_busy: str = "interrupt") -> str:
    """The cancellation reason of a run interrupted (or, ``if_busy="rollback"``, rolled
    back) by the submission ``dispatch_id``."""
    if if_busy == "rollback":
        return f"rolled back by {dispatch_id}"
    return f"interrupted by {dispatch_id}"


def fencing_intent(d: Dispatch, now: datetime) -> Dispatch:
    """The cancel intent a ``d.if_busy`` of ``FENCING`` makes of the thread's busy run."""
    return cancel_intent(
        d.thread_id,
        interrupt_reason(d.dispatch_id, d.if_busy),
        now,
        interrupted_by=d.dispatch_id,
        rollback=d.if_busy == "rollback",
    )
