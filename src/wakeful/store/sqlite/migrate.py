"""``migrate_runs`` on SQLite (issue 40, ``wakeful runs migrate``): in one write transaction,
the movable dispatches pinned to one version re-pinned to another, each with a
``run.migrated`` event appended to its thread (``wakeful.store.pins``)."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from wakeful.records import Dispatch
from wakeful.store.pins import check_running, migrated_event
from wakeful.store.sqlite import queue
from wakeful.store.sqlite.codec import DISPATCH_COLUMNS, dispatch_of, dumps, to_us

# the open statuses by ``dispatches_by_status`` (status, seq), filtered on the version: the
# walk is over unfinished work only, never the settled history
_MOVABLE = (
    "SELECT seq FROM dispatches INDEXED BY dispatches_by_status "
    "WHERE status IN ('pending', 'awaiting', 'quarantined') AND pinned_version = ? "
    "UNION ALL SELECT seq FROM dispatches INDEXED BY dispatches_lapsing "
    "WHERE status = 'leased' AND lease_expires < ? AND pinned_version = ? "
    "ORDER BY seq LIMIT ?"
)
_MOVE = (
    "UPDATE dispatches SET pinned_version = ?, released_from = NULL, updated_at = ? "
    f"WHERE seq = ? RETURNING {DISPATCH_COLUMNS}"
)
_RUN = (
    "SELECT t.next_seq, json_extract(c.body, '$.run_id') FROM threads t "
    "LEFT JOIN checkpoints c ON c.thread_id = t.thread_id AND c.checkpoint_id = t.latest_id "
    "WHERE t.thread_id = ?"
)
_EVENT = (
    "INSERT INTO events (thread_id, seq, at, type, data, run_id, checkpoint_id, task_id) "
    "VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)"
)


def migrate_runs(
    conn: sqlite3.Connection, now: datetime, from_version: str, to_version: str, limit: int
) -> list[Dispatch]:
    """``migrate_runs`` with checked arguments, in the caller's write transaction."""
    check_running(queue.workers_of(conn, to_version), to_version)
    at = to_us(now)
    seqs = [seq for (seq,) in conn.execute(_MOVABLE, (from_version, at, from_version, limit))]
    moved: list[Dispatch] = []
    for seq in seqs:
        d = dispatch_of(conn.execute(_MOVE, (to_version, at, seq)).fetchone())
        moved.append(d)
        row = conn.execute(_RUN, (d.thread_id,)).fetchone()
        if row is None:  # the thread was deleted (its dispatches stay): nothing to tell
            continue
        next_seq, run_id = row
        e = migrated_event(d, from_version, run_id)
        conn.execute(_EVENT, (d.thread_id, next_seq, at, e.type, dumps(e.data), e.run_id))
        conn.execute(
            "UPDATE threads SET next_seq = next_seq + 1, updated_at = ? WHERE thread_id = ?",
            (at, d.thread_id),
        )
    return moved
