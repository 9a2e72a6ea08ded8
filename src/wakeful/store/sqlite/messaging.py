"""The outbox relay and stream checkpoints in SQL.

A relay delivers one staged entry per write transaction: the inbox append, the ``message``
dispatch and the deletion of the staged entry commit together, so a crashed relay leaves
either nothing or everything of an entry done. The target thread's ``delivered`` ids make a
later relay of the same message a no-op, also after the target consumed it.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from wakeful.records import Dispatch, InboxMessage, StreamCheckpoint
from wakeful.store.projected import message_dispatch_id
from wakeful.store.sqlite import queue
from wakeful.store.sqlite.admission import admission
from wakeful.store.sqlite.codec import OUTBOX_ENTRY, STREAM_CHECKPOINT, dumps
from wakeful.store.validate import EncodedStreamCheckpoint, discards


def relay_one(conn: sqlite3.Connection, now: datetime, after_stage: int) -> int | None:
    """Deliver the oldest staged entry after ``after_stage``; returns its stage number, or
    ``None`` when nothing is staged after it."""
    row = conn.execute(
        "SELECT stage_seq, source_thread, body FROM outbox WHERE stage_seq > ? "
        "ORDER BY stage_seq LIMIT 1",
        (after_stage,),
    ).fetchone()
    if row is None:
        return None
    stage_seq, source, body = row
    entry = OUTBOX_ENTRY.decode(body)
    target = entry.target_thread
    delivered = conn.execute(
        "SELECT 1 FROM delivered WHERE thread_id = ? AND message_id = ?",
        (target, entry.message_id),
    ).fetchone()
    if delivered is None:
        found = conn.execute(
            "SELECT inbox_revision FROM threads WHERE thread_id = ?", (target,)
        ).fetchone()
        revision = (0 if found is None else found[0]) + 1
        message = InboxMessage(
            message_id=entry.message_id,
            correlation_id=entry.correlation_id,
            payload=entry.payload,
            revision=revision,
            at=now,
            source_thread=source,
        )
        conn.execute(
            "INSERT INTO threads (thread_id, inbox_revision) VALUES (?, ?) "
            "ON CONFLICT (thread_id) DO UPDATE SET inbox_revision = excluded.inbox_revision",
            (target, revision),
        )
        conn.execute(
            "INSERT INTO inbox (thread_id, message_id, revision, body) VALUES (?, ?, ?, ?)",
            (target, entry.message_id, revision, dumps(message)),
        )
        conn.execute(
            "INSERT INTO delivered (thread_id, message_id) VALUES (?, ?)",
            (target, entry.message_id),
        )
    dispatch_id = message_dispatch_id(target, entry.message_id)
    dispatch = Dispatch(
        dispatch_id=dispatch_id,
        thread_id=target,
        kind="message",
        payload={"message_id": entry.message_id},
        dedupe_key=dispatch_id,
        available_at=now,
        created_at=now,
        updated_at=now,
    )
    if queue.get(conn, dispatch_id) is None:
        dispatch, _ = admission(conn, now, dispatch)  # "enqueue": never a cancel
        queue.insert(conn, dispatch)
    conn.execute("DELETE FROM outbox WHERE stage_seq = ?", (stage_seq,))
    return int(stage_seq)


def put_stream_checkpoints(
    conn: sqlite3.Connection, now: datetime, checkpoints: list[EncodedStreamCheckpoint]
) -> list[bool]:
    """Store each checkpoint if its token is its thread's current claim (fenced puts, in
    order; ``updated_at`` defaults to ``now``); whether each was stored. The claims are
    read once for the batch and the stored rows written by one ``executemany``, in the
    writer's one transaction (nothing changes a claim between the two)."""
    threads = list({e.checkpoint.thread_id for e in checkpoints})
    claims: dict[str, int | None] = {}
    for start in range(0, len(threads), _IN_CHUNK):
        chunk = threads[start : start + _IN_CHUNK]
        claims.update(
            conn.execute(
                f"SELECT thread_id, token FROM threads WHERE thread_id IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
        )
    stored: list[bool] = []
    rows: list[tuple[str, str, str]] = []
    for encoded in checkpoints:
        checkpoint = encoded.checkpoint
        token = claims.get(checkpoint.thread_id)
        if token is None or token != checkpoint.token:
            stored.append(False)
            continue
        rows.append((checkpoint.run_id, checkpoint.thread_id, encoded.stamped(now).body.decode()))
        stored.append(True)
    conn.executemany(
        "INSERT INTO stream_checkpoints (run_id, thread_id, body) VALUES (?, ?, ?) "
        "ON CONFLICT (run_id) DO UPDATE "
        "SET thread_id = excluded.thread_id, body = excluded.body",
        rows,
    )
    return stored


_IN_CHUNK = 500
"""Thread ids per ``IN (...)`` list at most (SQLite's default limit on parameters is 999
before 3.32)."""


def get_stream_checkpoint(conn: sqlite3.Connection, run_id: str) -> StreamCheckpoint | None:
    row = conn.execute("SELECT body FROM stream_checkpoints WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else STREAM_CHECKPOINT.decode(row[0])


def delete_stream_checkpoint(conn: sqlite3.Connection, run_id: str) -> None:
    conn.execute("DELETE FROM stream_checkpoints WHERE run_id = ?", (run_id,))


def discard_stream_checkpoint(
    conn: sqlite3.Connection, run_id: str, task_id: str, token: int
) -> None:
    """Delete the run's checkpoint if it is turn ``task_id``'s, written under a token not
    above ``token`` (inside the write transaction: no put lands between read and delete)."""
    if discards(get_stream_checkpoint(conn, run_id), task_id, token):
        delete_stream_checkpoint(conn, run_id)
