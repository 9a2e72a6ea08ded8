"""Branches on SQLite (migration 0007): the step of a branching commit, and the reads that
see a thread's history through its branches (``store/branching.py`` maps the views)."""

from __future__ import annotations

import sqlite3
from typing import Any

from wakeful.errors import InvalidCommit
from wakeful.records import Branch, CheckpointEntry, Commit, Message
from wakeful.store.branching import branch_of, page_ranges, view_length, view_segments
from wakeful.store.sqlite.codec import CHECKPOINT, MESSAGE, from_us

_BRANCHES = (
    "SELECT number, parent, fork_point, old_head, checkpoint_id, messages, message_start, "
    "first_pos, at FROM branches WHERE thread_id = ? ORDER BY number"
)


def load(conn: sqlite3.Connection, thread_id: str) -> tuple[list[Branch], list[int]]:
    """The thread's branch records (branch 1 first) and each one's first checkpoint pos."""
    records: list[Branch] = []
    firsts: list[int] = []
    for number, parent, fork, old, first_id, kept, start, first_pos, at in conn.execute(
        _BRANCHES, (thread_id,)
    ):
        records.append(
            Branch(
                number=number,
                parent=parent,
                fork_point=fork,
                old_head=old,
                checkpoint_id=first_id,
                messages=kept,
                message_start=start,
                at=from_us(at),
            )
        )
        firsts.append(first_pos)
    return records, firsts


def check(
    conn: sqlite3.Connection, thread_id: str, c: Commit, stored_messages: int
) -> tuple[list[Branch], int]:
    """Step 3 of a branching commit (``c.branch_from`` set): the fork point is in the
    history and the branch keeps no more messages than its branch view has. Returns the
    thread's branches and the fork point's branch."""
    assert c.branch_from is not None
    row = conn.execute(
        "SELECT pos FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
        (thread_id, c.branch_from),
    ).fetchone()
    if row is None:
        raise InvalidCommit(
            thread_id,
            f"branch_from names checkpoint {c.branch_from!r}, which is not in the thread's "
            "history (never committed, dropped or pruned)",
        )
    records, firsts = load(conn, thread_id)
    parent = branch_of(firsts, row[0])
    shown = view_length(view_segments(records, parent), stored_messages)
    if c.branch_messages > shown:
        raise InvalidCommit(
            thread_id,
            f"branch_messages {c.branch_messages} is more than the {shown} messages of the "
            "fork point's branch",
        )
    return records, parent


def record(
    conn: sqlite3.Connection,
    thread_id: str,
    c: Commit,
    checked: tuple[list[Branch], int],
    old_head: str | None,
    stored_messages: int,
    first_pos: int,
    at: int,
) -> None:
    """Record the branch a checked branching commit starts (after its checkpoint and
    messages were written): its row, and the thread's head branch and view offset."""
    records, parent = checked
    assert c.branch_from is not None and c.checkpoint is not None
    number = len(records) + 1
    conn.execute(
        "INSERT INTO branches (thread_id, number, parent, fork_point, old_head, checkpoint_id, "
        "messages, message_start, first_pos, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            thread_id,
            number,
            parent,
            c.branch_from,
            old_head,
            c.checkpoint.id,
            c.branch_messages,
            stored_messages,
            first_pos,
            at,
        ),
    )
    conn.execute(
        "UPDATE threads SET branch = ?, message_offset = ? WHERE thread_id = ?",
        (number, c.branch_messages - stored_messages, thread_id),
    )


def _range(conn: sqlite3.Connection, thread_id: str, first: int, count: int) -> list[Message]:
    return [
        MESSAGE.decode(body)
        for (body,) in conn.execute(
            "SELECT body FROM messages WHERE thread_id = ? AND pos >= ? ORDER BY pos LIMIT ?",
            (thread_id, first, count),
        )
    ]


def view(
    conn: sqlite3.Connection, thread_id: str, branch: int | None, after: int, limit: int
) -> list[Message]:
    """A page of branch ``branch``'s message view (``None``: the head's)."""
    records, _ = load(conn, thread_id)
    if not records and not branch:
        return _range(conn, thread_id, after, limit)
    number = len(records) if branch is None else branch
    found: list[Message] = []
    for first, count in page_ranges(view_segments(records, number), after, limit):
        assert count is not None
        found += _range(conn, thread_id, first, count)
    return found


def _entry(firsts: list[int], row: Any) -> CheckpointEntry:
    body, at, pos = row
    return CheckpointEntry(
        checkpoint=CHECKPOINT.decode(body),
        committed_at=from_us(at),
        branch=branch_of(firsts, pos),
        order=pos,
    )


def history(
    conn: sqlite3.Connection, thread_id: str, before: str | None, limit: int
) -> list[CheckpointEntry]:
    below = 2**62
    if before is not None:
        row = conn.execute(
            "SELECT pos FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
            (thread_id, before),
        ).fetchone()
        if row is None:
            return []
        below = row[0]
    rows = conn.execute(
        "SELECT body, at, pos FROM checkpoints WHERE thread_id = ? AND pos < ? "
        "ORDER BY pos DESC LIMIT ?",
        (thread_id, below, limit),
    ).fetchall()
    if not rows:
        return []
    _, firsts = load(conn, thread_id)
    return [_entry(firsts, row) for row in rows]


def get(conn: sqlite3.Connection, thread_id: str, checkpoint_id: str) -> CheckpointEntry | None:
    row = conn.execute(
        "SELECT body, at, pos FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
        (thread_id, checkpoint_id),
    ).fetchone()
    if row is None:
        return None
    _, firsts = load(conn, thread_id)
    return _entry(firsts, row)
