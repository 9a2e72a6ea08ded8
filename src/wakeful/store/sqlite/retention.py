"""Retention (``prune``) in bounded write transactions.

One ``prune`` call judges age against one ``now`` and walks the threads in id order, a few
at a time; each step is its own short write transaction that deletes at most ``BATCH_ROWS``
rows, so a large backlog never holds the write lock (and blocks other processes) for long.
Every rule removes a prefix (oldest checkpoints, events below a raised floor), so a step cut
short by its budget is simply continued by the next one, with the same result as one big
transaction. The latest checkpoint, pending writes, messages and inboxes are never removed.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta

from wakeful.records import RetentionPolicy
from wakeful.store.sqlite.codec import to_us
from wakeful.store.sqlite.threads import raise_floor

BATCH_ROWS = 2000
BATCH_THREADS = 64


@dataclass
class Step:
    checkpoints: int = 0
    events: int = 0
    cursor: str | None = None
    finished: bool = False


def _cutoff(now: datetime, seconds: float | None) -> int | None:
    return None if seconds is None else to_us(now - timedelta(seconds=seconds))


def threads_step(
    conn: sqlite3.Connection, now: datetime, policy: RetentionPolicy, after: str | None
) -> Step:
    """Prune checkpoints and events of the threads after ``after``; stops when the row budget
    is spent. ``cursor`` is the last thread fully done (resume after it)."""
    step = Step(cursor=after)
    budget = BATCH_ROWS
    rows = conn.execute(
        "SELECT thread_id, latest_pos, next_seq, floor FROM threads "
        "WHERE thread_id > ? ORDER BY thread_id LIMIT ?",
        (after or "", BATCH_THREADS),
    ).fetchall()
    for thread_id, latest_pos, next_seq, floor in rows:
        removed = _checkpoints(conn, now, policy, thread_id, latest_pos, budget)
        step.checkpoints += removed
        budget -= removed
        if budget > 0:
            raised = _events(conn, now, policy, thread_id, next_seq, floor, budget)
            step.events += raised
            budget -= raised
        if budget <= 0:
            # This thread may have more to remove: the next step starts with it again.
            return step
        step.cursor = thread_id
    step.finished = len(rows) < BATCH_THREADS
    return step


def _checkpoints(
    conn: sqlite3.Connection,
    now: datetime,
    policy: RetentionPolicy,
    thread_id: str,
    latest_pos: int,
    budget: int,
) -> int:
    if latest_pos == 0 or (policy.keep_checkpoints is None and policy.checkpoint_max_age is None):
        return 0
    # Counted, not derived from positions: ``drop_checkpoints`` leaves gaps in them.
    row = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (thread_id,))
    count = int(row.fetchone()[0])
    removable = count - 1
    drop = 0
    if policy.keep_checkpoints is not None:
        drop = count - max(policy.keep_checkpoints, 1)
    cutoff = _cutoff(now, policy.checkpoint_max_age)
    if cutoff is not None:
        aged = 0
        for (at,) in conn.execute(
            "SELECT at FROM checkpoints WHERE thread_id = ? ORDER BY pos LIMIT ?",
            (thread_id, min(removable, budget)),
        ):
            if at >= cutoff:
                break
            aged += 1
        drop = max(drop, aged)
    take = min(drop, removable, budget)
    if take <= 0:
        return 0
    conn.execute(
        "DELETE FROM checkpoints WHERE thread_id = ?1 AND pos IN "
        "(SELECT pos FROM checkpoints WHERE thread_id = ?1 ORDER BY pos LIMIT ?2)",
        (thread_id, take),
    )
    return take


def _events(
    conn: sqlite3.Connection,
    now: datetime,
    policy: RetentionPolicy,
    thread_id: str,
    next_seq: int,
    floor: int,
    budget: int,
) -> int:
    new_floor = floor
    if policy.keep_events is not None:
        new_floor = max(new_floor, next_seq - max(policy.keep_events, 0))
    cutoff = _cutoff(now, policy.event_max_age)
    if cutoff is not None:
        aged_floor = floor
        for seq, at in conn.execute(
            "SELECT seq, at FROM events WHERE thread_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
            (thread_id, floor, budget),
        ):
            if at >= cutoff:
                break
            aged_floor = seq + 1
        new_floor = max(new_floor, aged_floor)
    new_floor = min(new_floor, floor + budget)
    if new_floor <= floor:
        return 0
    raise_floor(conn, thread_id, new_floor)
    return int(new_floor - floor)


def receipts_step(conn: sqlite3.Connection, now: datetime, max_age: float) -> int:
    """Delete up to ``BATCH_ROWS`` receipts older than ``max_age``; returns how many."""
    cursor = conn.execute(
        "DELETE FROM receipts WHERE rowid IN (SELECT rowid FROM receipts WHERE at < ? LIMIT ?)",
        (_cutoff(now, max_age), BATCH_ROWS),
    )
    return int(cursor.rowcount)


def dispatches_step(conn: sqlite3.Connection, now: datetime, max_age: float) -> int:
    """Delete up to ``BATCH_ROWS`` dispatches settled ``done`` before ``max_age``."""
    cursor = conn.execute(
        "DELETE FROM dispatches WHERE seq IN (SELECT seq FROM dispatches "
        "WHERE status = 'done' AND updated_at < ? LIMIT ?)",
        (_cutoff(now, max_age), BATCH_ROWS),
    )
    return int(cursor.rowcount)
