"""Read jobs on threads. Each runs inside one read transaction on a reader connection, so
everything it returns comes from one committed state."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from wakeful.errors import ReplayUnavailable
from wakeful.records import (
    Checkpoint,
    Event,
    InboxMessage,
    Receipt,
    RunSegment,
    ThreadSnapshot,
    ThreadSummary,
)
from wakeful.store.segments import join_adjacent
from wakeful.store.sqlite.codec import (
    CHECKPOINT,
    INBOX_MESSAGE,
    PENDING_WRITE,
    RECEIPT,
    claim_of,
    from_us,
    loads,
)


def read(conn: sqlite3.Connection, thread_id: str) -> ThreadSnapshot | None:
    row = conn.execute(
        "SELECT version, tenant, holder, token, expires_at, latest_pos, latest_id, next_seq, "
        "floor, message_count + message_offset, branch FROM threads WHERE thread_id = ?",
        (thread_id,),
    ).fetchone()
    if row is None:
        return None
    version, tenant, holder, token, expires, latest_pos, latest_id, next_seq, floor = row[:9]
    count, branch = row[9:]
    checkpoint = None
    if latest_id is not None:
        body = conn.execute(
            "SELECT body FROM checkpoints WHERE thread_id = ? AND pos = ?",
            (thread_id, latest_pos),
        ).fetchone()[0]
        checkpoint = CHECKPOINT.decode(body)
    writes = tuple(
        PENDING_WRITE.decode(body)
        for (body,) in conn.execute(
            "SELECT body FROM pending_writes WHERE thread_id = ? ORDER BY rowid", (thread_id,)
        )
    )
    return ThreadSnapshot(
        thread_id=thread_id,
        version=version,
        checkpoint=checkpoint,
        writes=writes,
        claim=None if token is None else claim_of(thread_id, holder, token, expires),
        tenant=tenant,
        message_count=count,
        last_seq=next_seq - 1,
        event_floor=floor,
        branch=branch,
    )


def operation(conn: sqlite3.Connection, thread_id: str, operation_id: str) -> Receipt | None:
    row = conn.execute(
        "SELECT receipt FROM receipts WHERE thread_id = ? AND operation_id = ?",
        (thread_id, operation_id),
    ).fetchone()
    return None if row is None else RECEIPT.decode(row[0])


def events_after(
    conn: sqlite3.Connection, thread_id: str, after_seq: int, limit: int
) -> list[Event]:
    row = conn.execute("SELECT floor FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
    if row is None:
        return []
    if after_seq < row[0] - 1:
        raise ReplayUnavailable(thread_id, after_seq, row[0])
    return [
        Event(
            thread_id=thread_id,
            seq=seq,
            at=from_us(at),
            type=type_,
            data=loads(data),
            run_id=run_id,
            checkpoint_id=checkpoint_id,
            task_id=task_id,
        )
        for seq, at, type_, data, run_id, checkpoint_id, task_id in conn.execute(
            "SELECT seq, at, type, data, run_id, checkpoint_id, task_id FROM events "
            "WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (thread_id, after_seq, limit),
        )
    ]


def list_threads(
    conn: sqlite3.Connection, tenant: str | None, after: str | None, limit: int
) -> list[ThreadSummary]:
    # ``listed`` (migration 0006) is ``version > 0`` set once per thread, which the listing
    # indexes filter on so that commits do not rewrite their entries.
    sql = (
        "SELECT thread_id, tenant, version, latest_id, latest_status, "
        "message_count + message_offset, "
        "next_seq, updated_at FROM threads WHERE listed = 1"
    )
    params: list[object] = []
    if tenant is not None:
        sql += " AND tenant = ?"
        params.append(tenant)
    if after is not None:
        sql += " AND thread_id > ?"
        params.append(after)
    sql += " ORDER BY thread_id LIMIT ?"
    params.append(limit)
    return [
        ThreadSummary(
            thread_id=tid,
            tenant=tenant_,
            version=version,
            checkpoint_id=latest_id,
            status=status,
            message_count=count,
            last_seq=next_seq - 1,
            updated_at=from_us(updated_at),
        )
        for tid, tenant_, version, latest_id, status, count, next_seq, updated_at in conn.execute(
            sql, params
        )
    ]


def checkpoints(
    conn: sqlite3.Connection, thread_id: str, before: str | None, limit: int
) -> list[tuple[Checkpoint, datetime]]:
    below = 2**62
    if before is not None:
        row = conn.execute(
            "SELECT pos FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
            (thread_id, before),
        ).fetchone()
        if row is None:
            return []
        below = row[0]
    return [
        (CHECKPOINT.decode(body), from_us(at))
        for body, at in conn.execute(
            "SELECT body, at FROM checkpoints WHERE thread_id = ? AND pos < ? "
            "ORDER BY pos DESC LIMIT ?",
            (thread_id, below, limit),
        )
    ]


_SEGMENT_LATEST = (
    "SELECT pos, checkpoint_id, at, run_id, status, graph, seg_first, ordinal FROM checkpoints "
    "WHERE thread_id = ? AND pos < ? ORDER BY pos DESC LIMIT 1"
)
_SEGMENT_FIRST = (
    "SELECT pos, checkpoint_id, at, ordinal FROM checkpoints "
    "WHERE thread_id = ? AND pos >= ? ORDER BY pos LIMIT 1"
)


def runs(
    conn: sqlite3.Connection, thread_id: str, before: str | None, limit: int
) -> list[RunSegment]:
    """``ThreadStore.runs``: from the latest checkpoint below ``before``, each segment is its
    latest row, the oldest row kept from where it began, and the next segment lies below
    that: two primary-key probes per segment (more only where stretches of one run id meet
    because what separated them was removed)."""
    below = 2**62
    if before is not None:
        row = conn.execute(
            "SELECT pos FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
            (thread_id, before),
        ).fetchone()
        if row is None:
            return []
        below = row[0]
    stretches: list[RunSegment] = []
    groups = 0
    while True:
        latest = conn.execute(_SEGMENT_LATEST, (thread_id, below)).fetchone()
        if latest is None:
            break
        _, last_id, updated, run_id, status, graph, seg_first, last_ordinal = latest
        if not stretches or stretches[-1].run_id != run_id:
            if groups == limit:
                break
            groups += 1
        first_pos, first_id, started, first_ordinal = conn.execute(
            _SEGMENT_FIRST, (thread_id, seg_first)
        ).fetchone()
        stretches.append(
            RunSegment(
                run_id=run_id,
                status=status,
                graph=graph,
                first_id=first_id,
                last_id=last_id,
                started_at=from_us(started),
                updated_at=from_us(updated),
                checkpoints=last_ordinal - first_ordinal + 1,
            )
        )
        below = first_pos
    return join_adjacent(stretches)


def inbox(conn: sqlite3.Connection, thread_id: str) -> list[InboxMessage]:
    return [
        INBOX_MESSAGE.decode(body)
        for (body,) in conn.execute(
            "SELECT body FROM inbox WHERE thread_id = ? ORDER BY revision", (thread_id,)
        )
    ]


def last_seqs(conn: sqlite3.Connection, thread_ids: list[str]) -> dict[str, int]:
    """The last event number of each named thread that exists (for waiters)."""
    marks = ", ".join("?" * len(thread_ids))
    return {
        tid: next_seq - 1
        for tid, next_seq in conn.execute(
            f"SELECT thread_id, next_seq FROM threads WHERE thread_id IN ({marks})", thread_ids
        )
    }
