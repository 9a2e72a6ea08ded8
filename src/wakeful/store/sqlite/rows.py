"""Writing dispatch rows in SQL: a complete record, and a cancel intent with what it
retires (used by the queue, the relay and the claim's due step)."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from wakeful.records import Dispatch
from wakeful.store.sqlite.claims import advance_epoch
from wakeful.store.sqlite.codec import DISPATCH_COLUMNS, dumps, to_us


def insert(conn: sqlite3.Connection, d: Dispatch) -> None:
    """Store a complete dispatch record; ``ON CONFLICT DO NOTHING`` for the relay's
    idempotent message dispatches."""
    assert d.available_at is not None and d.created_at is not None and d.updated_at is not None
    conn.execute(
        f"INSERT INTO dispatches ({DISPATCH_COLUMNS}) "
        f"VALUES ({', '.join('?' * 27)}) ON CONFLICT DO NOTHING",
        (
            d.dispatch_id,
            d.thread_id,
            d.kind,
            dumps(d.payload),
            d.priority,
            to_us(d.available_at),
            d.max_attempts,
            d.dedupe_key,
            d.status,
            d.attempts,
            d.token,
            d.holder,
            None if d.lease_until is None else to_us(d.lease_until),
            d.last_error,
            to_us(d.created_at),
            to_us(d.updated_at),
            d.tenant,
            d.if_busy,
            d.queued_behind,
            dumps(list(d.coalesced)) if d.coalesced else None,
            d.answered_by,
            d.pinned_version,
            d.released_from,
            d.debounce_key,
            d.concurrency_key,
            d.concurrency_limit,
            d.fair_tag,
        ),
    )


def retire_for(conn: sqlite3.Connection, now: datetime, intent: Dispatch) -> None:
    """Persist the cancel ``intent`` and act on it: retire the thread's other open
    dispatches (not the queued ones: the intent holds the run slot, so none is admitted
    until it settles), advance the epoch and end the claim."""
    thread_id, reason = intent.thread_id, intent.payload["reason"]
    insert(conn, intent)
    conn.execute(
        "UPDATE dispatches SET status = 'done', lease_until = NULL, last_error = ?, "
        "updated_at = ? WHERE thread_id = ? "
        "AND status IN ('scheduled', 'waiting_key', 'pending', 'leased', 'awaiting') "
        "AND dispatch_id <> ?",
        (f"cancelled: {reason}", to_us(now), thread_id, intent.dispatch_id),
    )  # (nothing is admitted: the intent holds the run slot until it settles)
    advance_epoch(conn, thread_id)
    conn.execute(
        "UPDATE threads SET holder = NULL, token = NULL, expires_at = NULL WHERE thread_id = ?",
        (thread_id,),
    )
