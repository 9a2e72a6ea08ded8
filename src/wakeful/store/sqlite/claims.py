"""Epochs and claim records: the primitives of every write that grants or fences a claim
(``threads``: claim, commit, delete; ``queue``: claim_next, settle, cancel).

A thread's epoch is the highest token issued (or advanced to) for it; its current claim is
the ``holder``/``token``/``expires_at`` of its ``threads`` row. A current claim's token is
always the thread's epoch: only ``grant_claim`` sets a token, and every other write that
advances the epoch (cancel, delete) ends or removes the claim in the same transaction.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from wakeful.records import Claim
from wakeful.store.sqlite.codec import to_us


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


def end_claim(conn: sqlite3.Connection, thread_id: str, token: int) -> None:
    """End the thread's claim if ``token`` is still its current one (else a no-op)."""
    conn.execute(
        "UPDATE threads SET holder = NULL, token = NULL, expires_at = NULL "
        "WHERE thread_id = ? AND token = ?",
        (thread_id, token),
    )
