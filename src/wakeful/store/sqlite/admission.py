"""Busy threads in SQL (issue 36, decision 0035): each thread has one run slot, held by a
dispatch while it waits for its key (``waiting_key``), is pending, leased, awaiting or
quarantined, or is scheduled after a lease (a retry's backoff, a sleep: ``holds_slot``).
``admission`` decides, inside
the writer's transaction, what a new run's dispatch becomes on its thread (pending, queued,
or refused); ``admit`` gives a freed slot to the thread's first queued dispatch. Every write
that frees a slot (a settle ``done`` alone or folded into a commit, a purge) calls ``admit``
in the same transaction; a cancel frees nothing (its intent holds the slot until it
settles)."""

from __future__ import annotations

import sqlite3
from datetime import datetime

import msgspec

from wakeful.errors import ThreadBusy
from wakeful.records import Dispatch
from wakeful.store.intents import fencing_intent, run_id_of
from wakeful.store.sqlite.codec import DISPATCH_COLUMNS, dispatch_of, dumps, to_us
from wakeful.store.sqlite.fair import ROW_TAG
from wakeful.store.validate_queue import FENCING

_HOLDER = (
    f"SELECT {DISPATCH_COLUMNS} FROM dispatches INDEXED BY dispatches_by_thread_status "
    f"WHERE thread_id = ? AND (status IN ('waiting_key', 'pending', 'leased', 'awaiting', "
    f"'quarantined') OR (status = 'scheduled' AND attempts > 0)) ORDER BY seq LIMIT 1"
)
_LAST_QUEUED = (
    "SELECT dispatch_id FROM dispatches INDEXED BY dispatches_by_thread_status "
    "WHERE thread_id = ? AND status = 'queued' ORDER BY seq DESC LIMIT 1"
)
_FIRST_QUEUED = (
    f"SELECT {DISPATCH_COLUMNS} FROM dispatches INDEXED BY dispatches_by_thread_status "
    f"WHERE thread_id = ? AND status = 'queued' ORDER BY seq LIMIT 1"
)


def slot_holder(conn: sqlite3.Connection, thread_id: str) -> Dispatch | None:
    """The dispatch holding the thread's run slot, if any."""
    row = conn.execute(_HOLDER, (thread_id,)).fetchone()
    return None if row is None else dispatch_of(row)


def admission(
    conn: sqlite3.Connection, now: datetime, d: Dispatch
) -> tuple[Dispatch, Dispatch | None]:
    """A run's dispatch ``d`` as its thread takes it (inside the writer's transaction, so
    decided atomically): pending on a free thread, else ``queued`` behind the last in line,
    with the cancel intent an ``interrupt`` or ``rollback`` makes of the busy run.
    ``reject`` on a busy thread is ``ThreadBusy`` naming the slot's holder, and nothing is
    written."""
    row = conn.execute(_HOLDER, (d.thread_id,)).fetchone()
    holder = None if row is None else dispatch_of(row)
    last = conn.execute(_LAST_QUEUED, (d.thread_id,)).fetchone()
    if holder is None and last is None:
        return d, None
    if d.if_busy == "reject":
        busy = holder or dispatch_of(conn.execute(_FIRST_QUEUED, (d.thread_id,)).fetchone())
        raise ThreadBusy(
            d.thread_id, busy.holder, None, run_id=run_id_of(busy), dispatch_id=busy.dispatch_id
        )
    behind = last[0] if last is not None else holder.dispatch_id if holder else None
    queued = msgspec.structs.replace(d, status="queued", queued_behind=behind)
    intent = None
    if d.if_busy in FENCING and holder is not None and holder.kind != "cancel":
        intent = fencing_intent(d, now)
    return queued, intent


_HEAD = (
    "SELECT seq, dispatch_id, if_busy, kind FROM dispatches "
    "INDEXED BY dispatches_by_thread_status "
    "WHERE thread_id = ? AND status = 'queued' ORDER BY seq LIMIT 1"
)
_BEHIND_HEAD = (
    "SELECT dispatch_id, if_busy, kind FROM dispatches INDEXED BY dispatches_by_thread_status "
    "WHERE thread_id = ? AND status = 'queued' AND seq > ? ORDER BY seq"
)
_HELD = (
    "SELECT 1 FROM dispatches INDEXED BY dispatches_by_thread_status "
    "WHERE thread_id = ? AND (status IN ('waiting_key', 'pending', 'leased', 'awaiting', "
    "'quarantined') OR (status = 'scheduled' AND attempts > 0)) LIMIT 1"
)


def admit(conn: sqlite3.Connection, thread_id: str, now: datetime) -> None:
    """Give the thread's run slot, if nothing holds it, to its first queued dispatch. A
    ``coalesce`` one takes the consecutive ``coalesce`` dispatches of its kind queued behind
    it into its run: they are settled ``done`` naming it (``answered_by``) and it lists them
    (``coalesced``). A thread nothing waits for costs one index probe."""
    head = conn.execute(_HEAD, (thread_id,)).fetchone()
    if head is None or conn.execute(_HELD, (thread_id,)).fetchone() is not None:
        return
    seq, head_id, if_busy, kind = head
    merged: list[str] = []
    if if_busy == "coalesce":
        rows = conn.execute(_BEHIND_HEAD, (thread_id, seq))
        try:
            for dispatch_id, other_if_busy, other_kind in rows:
                if other_if_busy != "coalesce" or other_kind != kind:
                    break
                merged.append(dispatch_id)
        finally:
            rows.close()
        conn.executemany(
            "UPDATE dispatches SET status = 'done', answered_by = ?, updated_at = ? "
            "WHERE dispatch_id = ?",
            [(head_id, to_us(now), dispatch_id) for dispatch_id in merged],
        )
    conn.execute(
        f"UPDATE dispatches SET status = 'pending', coalesced = ?, updated_at = ?, "
        f"fair_tag = {ROW_TAG} WHERE seq = ?",
        (dumps(merged) if merged else None, to_us(now), seq),
    )


__all__ = ["admission", "admit"]
