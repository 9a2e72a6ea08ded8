"""Rows to records and records to the JSON text the schema stores.

Bodies are msgspec JSON kept as ``text``; the columns next to them hold what the server
decides (sequence numbers, times, tokens) and what queries filter on.
"""

from __future__ import annotations

from typing import Any

import msgspec

from wakeful.records import (
    Checkpoint,
    Claim,
    Dispatch,
    Event,
    EventDraft,
    InboxMessage,
    Message,
    PendingWrite,
    StreamCheckpoint,
    ThreadSnapshot,
)
from wakeful.store.postgres.connection import utc, utc_or_none

_encode = msgspec.json.Encoder().encode
CHECKPOINT = msgspec.json.Decoder(Checkpoint)
WRITE = msgspec.json.Decoder(PendingWrite)
DRAFT = msgspec.json.Decoder(EventDraft)
MESSAGE = msgspec.json.Decoder(Message)
STREAM = msgspec.json.Decoder(StreamCheckpoint)
_ANY = msgspec.json.Decoder()

DISPATCH_COLUMNS = (
    "dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts, dedupe_key, "
    "status, attempts, token, holder, lease_until, last_error, created_at, updated_at, tenant"
)
"""The columns ``dispatch`` reads, in its order."""
DISPATCH_WIDTH = len(DISPATCH_COLUMNS.split(","))


def text(value: Any) -> str:
    """``value`` as JSON text."""
    return _encode(value).decode()


def json_value(body: str) -> Any:
    return _ANY.decode(body)


def claim(thread_id: str, holder: str | None, token: int | None, expires: Any) -> Claim | None:
    if token is None or holder is None:
        return None
    return Claim(thread_id=thread_id, holder=holder, token=token, expires_at=utc(expires))


def snapshot(
    thread_id: str,
    claimed: Claim | None,
    version: int,
    tenant: str | None,
    message_count: int,
    next_seq: int,
    floor: int,
    checkpoint: str | None,
    writes: list[str],
) -> ThreadSnapshot:
    """A thread read from its row, its latest checkpoint's body and its writes' bodies."""
    return ThreadSnapshot(
        thread_id=thread_id,
        version=version,
        checkpoint=None if checkpoint is None else CHECKPOINT.decode(checkpoint),
        writes=tuple(WRITE.decode(w) for w in writes),
        claim=claimed,
        tenant=tenant,
        message_count=message_count,
        last_seq=next_seq - 1,
        event_floor=floor,
    )


def event(thread_id: str, seq: int, at: Any, body: str) -> Event:
    draft = DRAFT.decode(body)
    return Event(
        thread_id=thread_id,
        seq=seq,
        at=utc(at),
        type=draft.type,
        data=draft.data,
        run_id=draft.run_id,
        checkpoint_id=draft.checkpoint_id,
        task_id=draft.task_id,
    )


def dispatch(row: tuple[Any, ...]) -> Dispatch:
    """A row of ``DISPATCH_COLUMNS``."""
    return Dispatch(
        dispatch_id=row[0],
        thread_id=row[1],
        kind=row[2],
        payload=json_value(row[3]),
        priority=row[4],
        available_at=utc(row[5]),
        max_attempts=row[6],
        dedupe_key=row[7],
        status=row[8],
        attempts=row[9],
        token=row[10],
        holder=row[11],
        lease_until=utc_or_none(row[12]),
        last_error=row[13],
        created_at=utc(row[14]),
        updated_at=utc(row[15]),
        tenant=row[16],
    )


def inbox_message(row: tuple[Any, ...]) -> InboxMessage:
    """A row of ``message_id, correlation_id, payload, revision, at, source_thread``."""
    return InboxMessage(
        message_id=row[0],
        correlation_id=row[1],
        payload=json_value(row[2]),
        revision=row[3],
        at=utc(row[4]),
        source_thread=row[5],
    )
