"""Time in SQL (issue 38, decision 0035): the claim's due step and debounce.

``promote_due`` runs first in every ``claim_next`` (inside the writer's transaction): the
``scheduled`` dispatches the store's clock reached (one range of ``dispatches_scheduled``,
up to a batch) go through admission, so the claim's own ranges hold no delayed row. A
dispatch leased before (a retry's backoff, a sleep) kept its thread's run slot and becomes
``pending``, as does a ``resume`` (which then retires the ``awaiting`` dispatches it takes
over) or a ``cancel``; a delayed run's dispatch is admitted as an enqueue at that moment
would be, its ``if_busy`` policy applied then (``reject``: settled ``done`` with the
reason; ``interrupt``/``rollback``: the busy run is fenced).

``debounced`` folds a debounced submission into the still ``scheduled`` dispatch of its
(thread, key), if there is one (issue 39)."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from wakeful.records import Dispatch
from wakeful.store.intents import fencing_intent, run_id_of
from wakeful.store.projected_due import DUE_BATCH
from wakeful.store.sqlite.admission import admit, slot_holder
from wakeful.store.sqlite.codec import DISPATCH_COLUMNS, dispatch_of, dumps, to_us
from wakeful.store.sqlite.rows import retire_for
from wakeful.store.validate_queue import FENCING, RUN_KINDS, holds_slot

_DUE = (
    f"SELECT {DISPATCH_COLUMNS} FROM dispatches INDEXED BY dispatches_scheduled "
    f"WHERE status = 'scheduled' AND available_at <= ? ORDER BY available_at, seq LIMIT ?"
)
_FIRST_QUEUED = (
    "SELECT dispatch_id FROM dispatches INDEXED BY dispatches_by_thread_status "
    "WHERE thread_id = ? AND status = 'queued' ORDER BY seq LIMIT 1"
)
_QUEUED_AHEAD = (
    "SELECT dispatch_id FROM dispatches INDEXED BY dispatches_by_thread_status "
    "WHERE thread_id = ? AND status = 'queued' AND seq < (SELECT seq FROM dispatches "
    "WHERE dispatch_id = ?) ORDER BY seq DESC LIMIT 1"
)
_SET = "UPDATE dispatches SET status = ?, queued_behind = ?, last_error = ?, updated_at = ? "


def promote_due(conn: sqlite3.Connection, now: datetime, limit: int = DUE_BATCH) -> int:
    """The due step of a claim at ``now``; returns how many dispatches it moved on."""
    rows = [dispatch_of(row) for row in conn.execute(_DUE, (to_us(now), limit)).fetchall()]
    for d in rows:
        _promote(conn, now, d)
    return len(rows)


def _promote(conn: sqlite3.Connection, now: datetime, d: Dispatch) -> None:
    at = to_us(now)
    where = "WHERE dispatch_id = ?"
    if holds_slot(d) or d.kind not in RUN_KINDS:
        if d.kind == "resume":
            conn.execute(
                "UPDATE dispatches SET status = 'done', updated_at = ? "
                "WHERE thread_id = ? AND status = 'awaiting'",
                (at, d.thread_id),
            )
        conn.execute(_SET + where, ("pending", d.queued_behind, d.last_error, at, d.dispatch_id))
        return
    holder = slot_holder(conn, d.thread_id)
    first = conn.execute(_FIRST_QUEUED, (d.thread_id,)).fetchone()
    if holder is None and first is None:
        conn.execute(_SET + where, ("pending", None, d.last_error, at, d.dispatch_id))
        return
    busy_id = holder.dispatch_id if holder is not None else str(first[0])
    if d.if_busy == "reject":
        run = run_id_of(holder) if holder is not None else None
        reason = f"thread busy when due: {busy_id}" + (f" ({run})" if run else "")
        conn.execute(_SET + where, ("done", None, reason, at, d.dispatch_id))
        return
    ahead = conn.execute(_QUEUED_AHEAD, (d.thread_id, d.dispatch_id)).fetchone()
    behind = str(ahead[0]) if ahead is not None else busy_id
    conn.execute(_SET + where, ("queued", behind, d.last_error, at, d.dispatch_id))
    if d.if_busy in FENCING and holder is not None and holder.kind != "cancel":
        retire_for(conn, now, fencing_intent(d, now))
    elif holder is None:
        admit(conn, d.thread_id, now)  # queued work with no holder ahead: the head goes on


def debounced(conn: sqlite3.Connection, now: datetime, d: Dispatch) -> Dispatch | None:
    """The scheduled dispatch of ``d``'s (thread, ``debounce_key``) with ``d``'s payload and
    due time, or ``None`` when there is none (``d`` is then stored as it is)."""
    assert d.debounce_key is not None and d.available_at is not None
    row = conn.execute(
        f"UPDATE dispatches SET payload = ?, available_at = ?, updated_at = ? "
        f"WHERE thread_id = ? AND debounce_key = ? AND status = 'scheduled' "
        f"RETURNING {DISPATCH_COLUMNS}",
        (dumps(d.payload), to_us(d.available_at), to_us(now), d.thread_id, d.debounce_key),
    ).fetchone()
    return None if row is None else dispatch_of(row)


__all__ = ["debounced", "promote_due"]
