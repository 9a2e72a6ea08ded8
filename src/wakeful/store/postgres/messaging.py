"""Inbox, outbox relay and stream checkpoints on PostgreSQL (DESIGN §3.4-§3.5).

The relay delivers one staged entry per transaction (the schema's ``relay_one``): append to
the target's inbox unless that ``message_id`` was ever delivered there, enqueue the target's
``message`` dispatch, delete the staged entry. A crash can only happen before or after that
transaction, so there is no half-delivered state to recover from; concurrent relays take
different entries (``SKIP LOCKED``).
"""

from __future__ import annotations

import msgspec

from wakeful.errors import StreamCheckpointError, WakefulError
from wakeful.ids import check_count, check_id
from wakeful.records import InboxMessage, StreamCheckpoint
from wakeful.store.postgres import codec
from wakeful.store.postgres.connection import Database, big, utc
from wakeful.store.validate import check_stream_checkpoint

_INBOX = """
SELECT message_id, correlation_id, payload, revision, at, source_thread
  FROM @schema@.inbox WHERE thread_id = %s AND NOT consumed ORDER BY revision
"""
_RELAY_ONE = "SELECT @schema@.relay_one()"
_STREAM_GET = "SELECT body, updated_at FROM @schema@.stream_checkpoints WHERE run_id = %s"
_STREAM_PUT = "SELECT @schema@.put_stream_checkpoint(%s, %s, %s, %s, %s)"
_STREAM_DELETE = "DELETE FROM @schema@.stream_checkpoints WHERE run_id = %s"


class MessagingOps:
    """The inbox/outbox half of ``PostgresStore``."""

    _db: Database

    async def inbox(self, thread_id: str) -> list[InboxMessage]:
        check_id("thread_id", thread_id)
        rows = await self._db.fetchall(_INBOX, (thread_id,), idempotent=True)
        return [codec.inbox_message(row) for row in rows]

    async def relay_outbox(self, limit: int = 100) -> int:
        limit = check_count("limit", limit, minimum=1)
        handled = 0
        while handled < limit:
            (delivered,) = await self._db.fetchone(_RELAY_ONE, None)
            if not delivered:
                break
            handled += 1
        return handled


class PostgresStreamCheckpoints:
    """Stream checkpoints in a table, fenced by the thread's current claim. Every failure,
    storage included, is a ``StreamCheckpointError``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, run_id: str) -> StreamCheckpoint | None:
        _checked_run_id(run_id)
        try:
            row = await self._db.fetchone(_STREAM_GET, (run_id,), idempotent=True)
        except Exception as exc:  # every failure is reported the one documented way
            raise StreamCheckpointError(run_id, "storage", str(exc)) from exc
        if row is None:
            return None
        checkpoint = codec.STREAM.decode(row[0])
        if checkpoint.updated_at is None:
            checkpoint = msgspec.structs.replace(checkpoint, updated_at=utc(row[1]))
        return checkpoint

    async def put(self, checkpoint: StreamCheckpoint) -> None:
        try:
            copy = check_stream_checkpoint(checkpoint)
        except WakefulError as exc:
            raise StreamCheckpointError(
                getattr(checkpoint, "run_id", "?"), "invalid", str(exc)
            ) from exc
        try:
            (stored,) = await self._db.fetchone(
                _STREAM_PUT,
                (copy.run_id, copy.thread_id, big(copy.token), codec.text(copy), copy.updated_at),
            )
        except Exception as exc:
            raise StreamCheckpointError(copy.run_id, "storage", str(exc)) from exc
        if not stored:
            raise StreamCheckpointError(
                copy.run_id,
                "stale",
                f"token {copy.token} is not the current claim of thread {copy.thread_id!r}",
            )

    async def delete(self, run_id: str) -> None:
        _checked_run_id(run_id)
        try:
            await self._db.execute(_STREAM_DELETE, (run_id,))
        except Exception as exc:
            raise StreamCheckpointError(run_id, "storage", str(exc)) from exc


def _checked_run_id(run_id: str) -> str:
    try:
        return check_id("run_id", run_id)
    except WakefulError as exc:
        raise StreamCheckpointError(str(run_id)[:40], "invalid", str(exc)) from exc
