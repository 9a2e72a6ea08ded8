"""Write jobs on threads: claims, commits, compaction and deletion.

Each function runs inside the writer's ``BEGIN IMMEDIATE`` transaction (see
``connection``), so it checks and changes one state that nobody else can change meanwhile,
and a raised error leaves nothing behind. The checks and their order are the reference
store's (``wakeful.store.projected``), so every backend refuses the same things the same way.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta

from wakeful.errors import (
    InvalidCommit,
    OperationConflict,
    StaleClaim,
    TenantMismatch,
    ThreadBusy,
    VersionConflict,
)
from wakeful.records import Claim, Commit, Receipt
from wakeful.store.projection import payload_hash
from wakeful.store.sqlite.codec import RECEIPT, dumps, from_us, to_us


def advance_epoch(conn: sqlite3.Connection, thread_id: str) -> int:
    """Raise the thread's epoch by one and return it: the next token, or the epoch that
    fences every token issued before (delete, cancel)."""
    row = conn.execute(
        "INSERT INTO epochs (thread_id, epoch) VALUES (?, 1) "
        "ON CONFLICT (thread_id) DO UPDATE SET epoch = epoch + 1 RETURNING epoch",
        (thread_id,),
    ).fetchone()
    return int(row[0])


def epoch_of(conn: sqlite3.Connection, thread_id: str) -> int:
    row = conn.execute("SELECT epoch FROM epochs WHERE thread_id = ?", (thread_id,)).fetchone()
    return 0 if row is None else int(row[0])


def current_token(conn: sqlite3.Connection, thread_id: str) -> int | None:
    row = conn.execute("SELECT token FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
    return None if row is None else row[0]


def grant_claim(conn: sqlite3.Connection, thread_id: str, holder: str, expires: datetime) -> Claim:
    """Issue a new token and make it the thread's claim (creating the thread row)."""
    token = advance_epoch(conn, thread_id)
    conn.execute(
        "INSERT INTO threads (thread_id, holder, token, expires_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (thread_id) DO UPDATE SET holder = excluded.holder, "
        "token = excluded.token, expires_at = excluded.expires_at",
        (thread_id, holder, token, to_us(expires)),
    )
    return Claim(thread_id=thread_id, holder=holder, token=token, expires_at=expires)


def claim(
    conn: sqlite3.Connection, now: datetime, thread_id: str, holder: str, ttl: float
) -> Claim:
    row = conn.execute(
        "SELECT holder, token, expires_at, latest_id FROM threads WHERE thread_id = ?",
        (thread_id,),
    ).fetchone()
    if row is not None and row[1] is not None and row[2] >= to_us(now):
        raise ThreadBusy(thread_id, row[0], row[3], from_us(row[2]))
    return grant_claim(conn, thread_id, holder, now + timedelta(seconds=ttl))


def renew(conn: sqlite3.Connection, now: datetime, thread_id: str, token: int, ttl: float) -> Claim:
    row = conn.execute(
        "SELECT holder, token FROM threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    current = None if row is None else row[1]
    if current is None or current != token:
        raise StaleClaim(thread_id, token, current)
    expires = now + timedelta(seconds=ttl)
    conn.execute(
        "UPDATE threads SET expires_at = ? WHERE thread_id = ?", (to_us(expires), thread_id)
    )
    # The lease of the dispatch granted with this claim follows the claim.
    conn.execute(
        "UPDATE dispatches SET lease_until = ? "
        "WHERE thread_id = ? AND status = 'leased' AND token = ?",
        (to_us(expires), thread_id, current),
    )
    return Claim(thread_id=thread_id, holder=row[0], token=current, expires_at=expires)


def release(conn: sqlite3.Connection, thread_id: str, token: int) -> None:
    current = current_token(conn, thread_id)
    if current is not None and current == token:
        conn.execute(
            "UPDATE threads SET holder = NULL, token = NULL, expires_at = NULL WHERE thread_id = ?",
            (thread_id,),
        )


# One round trip reads the thread and whether the commit's checkpoint id was used before
# (the latter is only acted on in step 4, in the contract's order).
_THREAD_FOR_COMMIT = (
    "SELECT token, version, tenant, latest_id, latest_pos, next_seq, message_count, "
    "write_count, (SELECT 1 FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2) "
    "FROM threads WHERE thread_id = ?1"
)


def commit(conn: sqlite3.Connection, now: datetime, thread_id: str, c: Commit) -> Receipt:
    """Apply a validated commit; the checks in the contract's order (``ThreadStore.commit``)."""
    new_id = c.checkpoint.id if c.checkpoint is not None else None
    row = conn.execute(_THREAD_FOR_COMMIT, (thread_id, new_id)).fetchone()
    # 1. fencing, always first
    current = None if row is None else row[0]
    if current is None or current != c.token:
        raise StaleClaim(thread_id, c.token, current)
    _, version, tenant, latest, latest_pos, next_seq, message_count, write_count, used = row
    # 2. a retried operation
    digest = ""
    if c.operation_id is not None:
        digest = payload_hash(c)
        recorded = conn.execute(
            "SELECT payload_hash, receipt FROM receipts WHERE thread_id = ? AND operation_id = ?",
            (thread_id, c.operation_id),
        ).fetchone()
        if recorded is not None:
            if recorded[0] != digest:
                raise OperationConflict(thread_id, c.operation_id)
            return RECEIPT.decode(recorded[1])
    # 3. the view the commit was prepared against
    if c.expected_version is not None and c.expected_version != version:
        raise VersionConflict(thread_id, c.expected_version, version)
    if c.checkpoint is not None and c.checkpoint.parent != latest:
        raise VersionConflict(thread_id, c.checkpoint.parent, latest, "parent checkpoint")
    # 4. consistency with the thread
    _check_consistency(conn, thread_id, c, version, tenant, latest, used is not None)
    # 5. apply everything
    at = to_us(now)
    resulting = c.checkpoint.id if c.checkpoint is not None else latest
    status = None
    if c.checkpoint is not None:
        latest_pos += 1
        status = c.checkpoint.status
        conn.execute(
            "INSERT INTO checkpoints (thread_id, pos, checkpoint_id, at, body) "
            "VALUES (?, ?, ?, ?, ?)",
            (thread_id, latest_pos, c.checkpoint.id, at, dumps(c.checkpoint)),
        )
        if write_count:
            conn.execute("DELETE FROM pending_writes WHERE thread_id = ?", (thread_id,))
        write_count = 0
    if c.writes:
        write_count += len(c.writes)
        conn.executemany(
            "INSERT INTO pending_writes (thread_id, task_id, body) VALUES (?, ?, ?)",
            [(thread_id, w.task_id, dumps(w)) for w in c.writes],
        )
    seqs = tuple(range(next_seq, next_seq + len(c.events)))
    if c.events:
        conn.executemany(
            "INSERT INTO events (thread_id, seq, at, type, data, run_id, checkpoint_id, task_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (thread_id, seq, at, e.type, dumps(e.data), e.run_id, e.checkpoint_id, e.task_id)
                for seq, e in zip(seqs, c.events, strict=True)
            ],
        )
    if c.messages:
        conn.executemany(
            "INSERT INTO messages (thread_id, pos, message_id, body) VALUES (?, ?, ?, ?)",
            [(thread_id, message_count + i, m.id, dumps(m)) for i, m in enumerate(c.messages)],
        )
    if c.outbox:
        conn.executemany(
            "INSERT INTO outbox (source_thread, target_thread, message_id, body, at) "
            "VALUES (?, ?, ?, ?, ?)",
            [(thread_id, e.target_thread, e.message_id, dumps(e), at) for e in c.outbox],
        )
    if c.consume:
        conn.executemany(
            "DELETE FROM inbox WHERE thread_id = ? AND message_id = ?",
            [(thread_id, message_id) for message_id in c.consume],
        )
    receipt = Receipt(
        thread_id=thread_id,
        version=version + 1,
        checkpoint_id=resulting,
        events=seqs,
        operation_id=c.operation_id,
    )
    if c.operation_id is not None:
        conn.execute(
            "INSERT INTO receipts (thread_id, operation_id, payload_hash, receipt, at) "
            "VALUES (?, ?, ?, ?, ?)",
            (thread_id, c.operation_id, digest, dumps(receipt), at),
        )
    if version == 0:
        tenant = c.checkpoint.tenant if c.checkpoint is not None else None
    conn.execute(
        "UPDATE threads SET version = ?, tenant = ?, latest_pos = ?, latest_id = ?, "
        "latest_status = coalesce(?, latest_status), next_seq = ?, message_count = ?, "
        "write_count = ?, updated_at = ? WHERE thread_id = ?",
        (
            version + 1,
            tenant,
            latest_pos,
            resulting,
            status,
            next_seq + len(c.events),
            message_count + len(c.messages),
            write_count,
            at,
            thread_id,
        ),
    )
    return receipt


def _check_consistency(
    conn: sqlite3.Connection,
    tid: str,
    c: Commit,
    version: int,
    tenant: str | None,
    latest: str | None,
    used: bool,
) -> None:
    resulting = c.checkpoint.id if c.checkpoint is not None else latest
    if c.checkpoint is not None:
        if used:
            raise InvalidCommit(tid, f"checkpoint id {c.checkpoint.id!r} was used before")
        if version > 0 and c.checkpoint.tenant != tenant:
            raise TenantMismatch(tid)
    tasks: set[str] = set()
    for write in c.writes:
        if write.checkpoint_id != resulting:
            raise InvalidCommit(
                tid,
                f"write of task {write.task_id!r} names checkpoint {write.checkpoint_id!r} but "
                f"the latest after this commit is {resulting!r}",
            )
        # A new checkpoint drops the previous writes, so only the commit's own count then.
        if write.task_id in tasks or (
            c.checkpoint is None
            and conn.execute(
                "SELECT 1 FROM pending_writes WHERE thread_id = ? AND task_id = ?",
                (tid, write.task_id),
            ).fetchone()
            is not None
        ):
            raise InvalidCommit(tid, f"task {write.task_id!r} already has a write")
        tasks.add(write.task_id)
    seen: set[str] = set()
    for message in c.messages:
        if (
            message.id in seen
            or conn.execute(
                "SELECT 1 FROM messages WHERE thread_id = ? AND message_id = ?", (tid, message.id)
            ).fetchone()
            is not None
        ):
            raise InvalidCommit(tid, f"message id {message.id!r} is already on the thread")
        seen.add(message.id)
    staged: set[str] = set()
    for entry in c.outbox:
        if entry.message_id in staged:
            raise InvalidCommit(tid, f"outbox message id {entry.message_id!r} appears twice")
        staged.add(entry.message_id)
    consumed: set[str] = set()
    for message_id in c.consume:
        if (
            message_id in consumed
            or conn.execute(
                "SELECT 1 FROM inbox WHERE thread_id = ? AND message_id = ?", (tid, message_id)
            ).fetchone()
            is None
        ):
            raise InvalidCommit(tid, f"inbox message {message_id!r} is not waiting to be consumed")
        consumed.add(message_id)


def compact_events(conn: sqlite3.Connection, thread_id: str, before_seq: int) -> int:
    row = conn.execute(
        "SELECT floor, next_seq FROM threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    if row is None:
        return 1
    floor, next_seq = row
    new_floor = max(floor, min(before_seq, next_seq))
    if new_floor != floor:
        raise_floor(conn, thread_id, new_floor)
    return int(new_floor)


def raise_floor(conn: sqlite3.Connection, thread_id: str, floor: int) -> None:
    conn.execute("DELETE FROM events WHERE thread_id = ? AND seq < ?", (thread_id, floor))
    conn.execute("UPDATE threads SET floor = ? WHERE thread_id = ?", (floor, thread_id))


_THREAD_TABLES = (
    "threads",
    "checkpoints",
    "pending_writes",
    "events",
    "messages",
    "receipts",
    "inbox",
    "delivered",
    "stream_checkpoints",
)


def delete_thread(conn: sqlite3.Connection, thread_id: str) -> bool:
    """Remove everything of the thread but its epoch, which advances (fencing its claim).
    Returns False when the store held nothing of it."""
    exists = conn.execute("SELECT 1 FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
    staged = conn.execute(
        "SELECT 1 FROM outbox WHERE source_thread = ? LIMIT 1", (thread_id,)
    ).fetchone()
    if exists is None and staged is None:
        return False
    advance_epoch(conn, thread_id)
    for table in _THREAD_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
    conn.execute("DELETE FROM outbox WHERE source_thread = ?", (thread_id,))
    return True
