"""The claim's due step in the memory and file stores (issue 38, decision 0035): the
``scheduled`` dispatches whose ``available_at`` the store's clock reached go through
admission before the claim reads its candidates, so the claim walks no delayed row.

``due_record`` plans one step (read-only, against the current state); ``promote`` applies
it (deterministic, from ``State.apply``): a dispatch that holds its thread's slot already
(a retry's backoff, a sleep) or bypasses admission (``resume``, ``cancel``) becomes
``pending``; a delayed run's dispatch is admitted as an enqueue would be at that moment:
``pending`` on a free thread, else ``queued`` (in enqueue order) with its ``if_busy``
policy applied then (``reject`` settles it ``done`` with the reason, ``interrupt`` and
``rollback`` fence the busy run)."""

from __future__ import annotations

import uuid
from datetime import datetime

import msgspec

from wakeful.records import Dispatch
from wakeful.store.intents import fencing_intent, run_id_of
from wakeful.store.mutations import Cancelled, Promoted
from wakeful.store.projected_index import QueueIndexes as State
from wakeful.store.validate_queue import FENCING, RUN_KINDS, holds_slot

DUE_BATCH = 100
"""Scheduled dispatches one claim call moves on at most (the rest: the next calls)."""


def due_record(state: State, now: datetime, limit: int = DUE_BATCH) -> Promoted | None:
    """The due step of a claim at ``now``, or ``None`` when nothing is due."""
    due: list[str] = []
    cancel_ids: list[str | None] = []
    for at, _, did in state.scheduled:
        if at > now or len(due) == limit:
            break
        d = state.dispatches[did]
        due.append(did)
        fences = d.kind in RUN_KINDS and d.if_busy in FENCING
        cancel_ids.append(f"cancel-{uuid.uuid4().hex}" if fences else None)
    if not due:
        return None
    return Promoted(tuple(due), tuple(cancel_ids), now)


def promote(state: State, record: Promoted) -> None:
    """Apply a due step: each dispatch through admission, in order."""
    for did, cancel_id in zip(record.dispatch_ids, record.cancel_ids, strict=True):
        d = state.dispatches.get(did)
        if d is not None and d.status == "scheduled":
            _promote_one(state, d, cancel_id, record.at)


def _promote_one(state: State, d: Dispatch, cancel_id: str | None, at: datetime) -> None:
    replace = msgspec.structs.replace
    if holds_slot(d) or d.kind not in RUN_KINDS:
        if d.kind == "resume":
            state._retire_awaiting(d.thread_id, at)
        state._put_dispatch(replace(d, status="pending", updated_at=at))
        return
    holder = state.slot_holder(d.thread_id)
    waiting = state.queued.get(d.thread_id, [])
    if holder is None and not waiting:
        state._put_dispatch(replace(d, status="pending", updated_at=at))
        return
    busy = holder if holder is not None else state.dispatches[waiting[0]]
    if d.if_busy == "reject":
        run = run_id_of(busy)
        reason = f"thread busy when due: {busy.dispatch_id}" + (f" ({run})" if run else "")
        state._put_dispatch(replace(d, status="done", last_error=reason, updated_at=at))
        return
    order = state.dispatch_order[d.dispatch_id]
    ahead = [w for w in waiting if state.dispatch_order[w] < order]
    behind = ahead[-1] if ahead else busy.dispatch_id
    state._put_dispatch(replace(d, status="queued", queued_behind=behind, updated_at=at))
    if cancel_id is not None and holder is not None and holder.kind != "cancel":
        intent = replace(fencing_intent(d, at), dispatch_id=cancel_id)
        reason = str(intent.payload["reason"])
        epoch = state.epochs.get(d.thread_id, 0) + 1
        state.apply(Cancelled(d.thread_id, reason, epoch, intent, at))
