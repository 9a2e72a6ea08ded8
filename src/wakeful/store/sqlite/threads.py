"""Write jobs on threads: claims, commits, compaction and deletion.

Each function runs inside the writer's ``BEGIN IMMEDIATE`` transaction (see
``connection``), so it checks and changes one state that nobody else can change meanwhile,
and a raised error leaves nothing behind. The checks and their order are the reference
store's (``wakeful.store.projected``), so every backend refuses the same things the same way.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from typing import Any

from wakeful.errors import (
    InvalidCommit,
    OperationConflict,
    StaleClaim,
    TenantMismatch,
    ThreadBusy,
    VersionConflict,
)
from wakeful.records import Checkpoint, Claim, Commit, Receipt
from wakeful.store.segments import graph_of
from wakeful.store.sqlite import branches, queue
from wakeful.store.sqlite.claims import advance_epoch, end_claim, grant_claim
from wakeful.store.sqlite.codec import RECEIPT, dumps, from_us, to_us
from wakeful.store.sqlite.tenants import bind_tenant, check_tenant
from wakeful.store.validate import EncodedCommit, drop_refusal, payload_hash


def _check_free(
    thread_id: str,
    now: datetime,
    holder: str | None,
    token: int | None,
    expires: int | None,
    latest: str | None,
) -> None:
    """``ThreadBusy`` while the thread's claim record is live."""
    if token is not None and expires is not None and expires >= to_us(now):
        assert holder is not None
        raise ThreadBusy(thread_id, holder, latest, from_us(expires))


def claim(
    conn: sqlite3.Connection,
    now: datetime,
    thread_id: str,
    holder: str,
    ttl: float,
    tenant: str | None = None,
) -> Claim:
    check_tenant(conn, thread_id, tenant)  # first: a busy refusal names the holder
    row = conn.execute(
        "SELECT holder, token, expires_at, latest_id FROM threads WHERE thread_id = ?",
        (thread_id,),
    ).fetchone()
    if row is not None:
        _check_free(thread_id, now, *row)
    granted = grant_claim(conn, thread_id, holder, now + timedelta(seconds=ttl))
    bind_tenant(conn, thread_id, tenant)
    return granted


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
    end_claim(conn, thread_id, token)


# One statement reads the thread, its claim record, whether the commit's checkpoint id was
# used before (only acted on in step 4, in the contract's order), the run segment columns of
# its latest checkpoint (which a new checkpoint continues) and the receipt recorded for the
# commit's operation id (step 2): two statements less per commit of the runtime. The latest
# checkpoint is the one at ``latest_pos`` (as ``reads.read`` relies on too: retention
# and ``drop_checkpoints`` never remove it), one key lookup rather than a max() probe.
_THREAD_COLUMNS = (
    "SELECT t.token, t.version, t.tenant, t.latest_id, t.latest_pos, t.next_seq, "
    "t.message_count, t.write_count, "
    "(SELECT 1 FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2), "
    "t.holder, t.expires_at, c.run_id, c.seg_first, c.ordinal, "
)
_THREAD_JOINS = (
    "FROM threads AS t LEFT JOIN checkpoints AS c ON c.thread_id = ?1 AND c.pos = t.latest_pos "
)
_THREAD_FOR_COMMIT = (
    f"{_THREAD_COLUMNS}r.payload_hash, r.receipt {_THREAD_JOINS}"
    "LEFT JOIN receipts AS r ON r.thread_id = ?1 AND r.operation_id = ?3 "
    "WHERE t.thread_id = ?1"
)
# A commit without an operation id has no receipt to look for: the same row with the
# receipt columns NULL, one index probe (about 1.2 µs of the writer thread) less.
_THREAD_FOR_PLAIN_COMMIT = f"{_THREAD_COLUMNS}NULL, NULL {_THREAD_JOINS}WHERE t.thread_id = ?1"


def _thread_for_commit(
    conn: sqlite3.Connection, thread_id: str, new_id: str | None, operation_id: str | None
) -> Any:
    """The row ``_apply`` starts from (``_THREAD_FOR_COMMIT``); None if the thread has none."""
    if operation_id is None:
        return conn.execute(_THREAD_FOR_PLAIN_COMMIT, (thread_id, new_id)).fetchone()
    return conn.execute(_THREAD_FOR_COMMIT, (thread_id, new_id, operation_id)).fetchone()


# What ``_apply`` reads of a thread that has no row yet: the schema's defaults (0001), no
# checkpoint, no receipt.
_NEW_THREAD = (None, 0, None, None, 0, 1, 0, 0, None, None, None, None, None, None, None, None)

# A receipt is replayed to a stale token only while the thread's epoch is still that token:
# the claim was ended (release, settle) but no claim was granted after it.
_RECORDED_UNDER_EPOCH = (
    "SELECT r.payload_hash, r.receipt FROM receipts AS r "
    "JOIN epochs AS e ON e.thread_id = r.thread_id "
    "WHERE r.thread_id = ? AND r.operation_id = ? AND e.epoch = ?"
)


def commit(
    conn: sqlite3.Connection, now: datetime, thread_id: str, encoded: EncodedCommit
) -> Receipt:
    """Apply a validated commit; the checks in the contract's order (``ThreadStore.commit``)."""
    c = encoded.commit
    new_id = c.checkpoint.id if c.checkpoint is not None else None
    row = _thread_for_commit(conn, thread_id, new_id, c.operation_id)
    # 1. fencing, always first
    current = None if row is None else row[0]
    if current is None or current != c.token:
        if current is None and c.operation_id is not None:
            recorded = conn.execute(
                _RECORDED_UNDER_EPOCH, (thread_id, c.operation_id, c.token)
            ).fetchone()
            if recorded is not None and recorded[0] == payload_hash(c):
                return RECEIPT.decode(recorded[1])
        applied = None
        # the row carries the operation's receipt (``_THREAD_FOR_COMMIT``): a refused retry
        # of an applied commit learns that it was applied
        if row is not None and row[14] is not None and row[14] == payload_hash(c):
            applied = RECEIPT.decode(row[15])
        raise StaleClaim(thread_id, c.token, current, applied)
    return _apply(conn, now, thread_id, encoded, row)


def claim_and_commit(
    conn: sqlite3.Connection,
    now: datetime,
    thread_id: str,
    holder: str,
    ttl: float,
    encoded: EncodedCommit,
) -> tuple[Claim, Receipt]:
    """``claim``, then ``commit`` under the granted token (``c.token`` is ignored). Runs as
    one write job: a refused commit raises, which rolls the claim back with it."""
    c = encoded.commit
    new_id = c.checkpoint.id if c.checkpoint is not None else None
    row = _thread_for_commit(conn, thread_id, new_id, c.operation_id)
    if row is not None:
        if c.checkpoint is not None:
            # the tenant first: a busy refusal would name another tenant's holder
            _check_checkpoint_tenant(thread_id, c.checkpoint.tenant, row[1], row[2])
        _check_free(thread_id, now, row[9], row[0], row[10], row[3])
    granted = grant_claim(conn, thread_id, holder, now + timedelta(seconds=ttl))
    # The row as the grant left it: the new token, everything else unchanged.
    thread = (granted.token, *(_NEW_THREAD if row is None else row)[1:])
    return granted, _apply(conn, now, thread_id, encoded.with_token(granted.token), thread)


def _apply(
    conn: sqlite3.Connection,
    now: datetime,
    thread_id: str,
    encoded: EncodedCommit,
    row: tuple[Any, ...],
) -> Receipt:
    """Steps 2-5 of ``commit`` for the holder of ``c.token``, then everything applies.
    ``row`` is what ``_THREAD_FOR_COMMIT`` read (the token as the caller's claim has it).
    The JSON bodies are cut from the commit's one encoding."""
    c = encoded.commit
    _, version, tenant, latest, latest_pos, next_seq, message_count, write_count, used = row[:9]
    # 2. a retried operation
    digest = ""
    if c.operation_id is not None:
        digest = payload_hash(c)
        recorded_hash, recorded = row[14:16]
        if recorded_hash is not None:
            if recorded_hash != digest:
                raise OperationConflict(thread_id, c.operation_id)
            return RECEIPT.decode(recorded)
    # 3. the view the commit was prepared against
    if c.expected_version is not None and c.expected_version != version:
        raise VersionConflict(thread_id, c.expected_version, version)
    fork = None
    if c.branch_from is not None:
        fork = branches.check(conn, thread_id, c, message_count)
    elif c.checkpoint is not None and c.checkpoint.parent != latest:
        raise VersionConflict(thread_id, c.checkpoint.parent, latest, "parent checkpoint")
    # 4. consistency with the thread
    _check_consistency(conn, thread_id, c, version, tenant, latest, used is not None)
    # 5. the dispatch it settles
    if c.settle is not None:
        queue.check_commit_settle(conn, thread_id, c.token, c.settle.dispatch_id)
    # then everything applies
    at = to_us(now)
    resulting = c.checkpoint.id if c.checkpoint is not None else latest
    status = None
    if c.checkpoint is not None:
        latest_pos += 1
        status = c.checkpoint.status
        body = encoded.checkpoint_text()
        assert body is not None
        _insert_checkpoint(conn, thread_id, latest_pos, c.checkpoint, body, at, row[11:14])
        if write_count:
            conn.execute("DELETE FROM pending_writes WHERE thread_id = ?", (thread_id,))
        write_count = 0
    if c.drop_checkpoints:
        _rows(
            conn,
            "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
            [(thread_id, checkpoint_id) for checkpoint_id in c.drop_checkpoints],
        )
    if c.writes:
        write_count += len(c.writes)
        _rows(
            conn,
            "INSERT INTO pending_writes (thread_id, task_id, body) VALUES (?, ?, ?)",
            [
                (thread_id, w.task_id, body)
                for w, body in zip(c.writes, encoded.write_texts(), strict=True)
            ],
        )
    seqs = tuple(range(next_seq, next_seq + len(c.events)))
    if c.events:
        _rows(
            conn,
            "INSERT INTO events (thread_id, seq, at, type, data, run_id, checkpoint_id, task_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (thread_id, seq, at, e.type, data, e.run_id, e.checkpoint_id, e.task_id)
                for seq, e, data in zip(seqs, c.events, encoded.event_data_texts(), strict=True)
            ],
        )
    if c.messages:
        _rows(
            conn,
            "INSERT INTO messages (thread_id, pos, message_id, body) VALUES (?, ?, ?, ?)",
            [
                (thread_id, message_count + i, m.id, body)
                for i, (m, body) in enumerate(zip(c.messages, encoded.message_texts(), strict=True))
            ],
        )
    if c.outbox:
        _rows(
            conn,
            "INSERT INTO outbox (source_thread, target_thread, message_id, body, at) "
            "VALUES (?, ?, ?, ?, ?)",
            [
                (thread_id, e.target_thread, e.message_id, body, at)
                for e, body in zip(c.outbox, encoded.outbox_texts(), strict=True)
            ],
        )
    if c.consume:
        _rows(
            conn,
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
    if c.settle is not None:
        queue.settle_lease(conn, now, c.settle.dispatch_id, c.settle.outcome)
    # A settle ends the claim as ``settle`` does, ``release`` as ``release`` does: both
    # in the thread's update (the token is current, fencing checked it).
    ending = c.release or c.settle is not None
    if version == 0:
        if c.checkpoint is not None and tenant is None:
            tenant = c.checkpoint.tenant  # the first write naming a tenant fixes it
        update = _FIRST_ENDING_CLAIM if ending else _FIRST
        fixed: tuple[Any, ...] = (version + 1, tenant)
    else:
        # Later commits leave the tenant column alone: not naming it in the SET list spares
        # the tenant trigger (migration 0003) its check on every commit.
        update = _UPDATE_ENDING_CLAIM if ending else _UPDATE
        fixed = (version + 1,)
    conn.execute(
        update,
        (
            *fixed,
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
    if fork is not None:
        branches.record(conn, thread_id, c, fork, latest, message_count, latest_pos, at)
    return receipt


_UPDATE_REST = (
    "latest_pos = ?, latest_id = ?, latest_status = coalesce(?, latest_status), "
    "next_seq = ?, message_count = ?, write_count = ?, updated_at = ?"
)
_ENDING_CLAIM = ", holder = NULL, token = NULL, expires_at = NULL"
# The first commit also sets ``listed`` (migration 0006), which the listing indexes filter on,
# so that later commits, which change ``version``, leave those indexes alone.
_FIRST = (
    f"UPDATE threads SET version = ?, tenant = ?, listed = 1, {_UPDATE_REST} WHERE thread_id = ?"
)
_FIRST_ENDING_CLAIM = (
    f"UPDATE threads SET version = ?, tenant = ?, listed = 1, {_UPDATE_REST}{_ENDING_CLAIM} "
    "WHERE thread_id = ?"
)
_UPDATE = f"UPDATE threads SET version = ?, {_UPDATE_REST} WHERE thread_id = ?"
_UPDATE_ENDING_CLAIM = (
    f"UPDATE threads SET version = ?, {_UPDATE_REST}{_ENDING_CLAIM} WHERE thread_id = ?"
)


def _rows(conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """``conn.executemany(sql, rows)``; a single row (a commit's usual one event or write)
    through ``execute``, which skips ``executemany``'s iterator (about 0.7 µs a call)."""
    if len(rows) == 1:
        conn.execute(sql, rows[0])
    else:
        conn.executemany(sql, rows)


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
        _check_checkpoint_tenant(tid, c.checkpoint.tenant, version, tenant)
    for dropped in c.drop_checkpoints:
        if (
            dropped == resulting
            or conn.execute(
                "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
                (tid, dropped),
            ).fetchone()
            is None
        ):
            raise InvalidCommit(tid, drop_refusal(dropped, resulting))
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


def _check_checkpoint_tenant(
    thread_id: str, named: str | None, version: int, tenant: str | None
) -> None:
    """A checkpoint of tenant ``named`` on a thread whose tenant is fixed (by its first
    commit, or by a write naming one) must be of that tenant; ``None`` names none."""
    if (version > 0 or tenant is not None) and named != tenant:
        raise TenantMismatch(thread_id)


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
    "branches",
    "receipts",
    "inbox",
    "delivered",
    "stream_checkpoints",
)


def _insert_checkpoint(
    conn: sqlite3.Connection,
    thread_id: str,
    pos: int,
    cp: Checkpoint,
    body: str,
    at: int,
    before: tuple[Any, ...],
) -> None:
    """Insert ``cp`` (its JSON: ``body``) at ``pos`` with its run segment columns (migration
    0005): it continues the segment of the checkpoint before it when both have its run id.
    ``before`` is that checkpoint's ``(run_id, seg_first, ordinal)``, all None when the
    thread has none."""
    run_id, before_first, before_ordinal = before
    seg_first = before_first if before_ordinal is not None and run_id == cp.run_id else pos
    ordinal = before_ordinal + 1 if before_ordinal is not None else 1
    conn.execute(
        "INSERT INTO checkpoints (thread_id, pos, checkpoint_id, at, body, run_id, status, "
        "graph, seg_first, ordinal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            thread_id,
            pos,
            cp.id,
            at,
            body,
            cp.run_id,
            cp.status,
            graph_of(cp),
            seg_first,
            ordinal,
        ),
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
