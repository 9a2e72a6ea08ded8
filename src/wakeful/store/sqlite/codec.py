"""How records are stored in SQLite columns: times as integer microseconds since the Unix
epoch in UTC (exact for the records' microsecond datetimes), JSON values as TEXT."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from wakeful.records import (
    Checkpoint,
    Claim,
    Dispatch,
    InboxMessage,
    Message,
    OutboxEntry,
    PendingWrite,
    Receipt,
    StreamCheckpoint,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)

_encoder = msgspec.json.Encoder()
_any = msgspec.json.Decoder()
CHECKPOINT = msgspec.json.Decoder(Checkpoint)
PENDING_WRITE = msgspec.json.Decoder(PendingWrite)
MESSAGE = msgspec.json.Decoder(Message)
RECEIPT = msgspec.json.Decoder(Receipt)
INBOX_MESSAGE = msgspec.json.Decoder(InboxMessage)
OUTBOX_ENTRY = msgspec.json.Decoder(OutboxEntry)
STREAM_CHECKPOINT = msgspec.json.Decoder(StreamCheckpoint)


def to_us(dt: datetime) -> int:
    """Microseconds since the epoch; exact for any aware datetime."""
    return (dt - EPOCH) // _ONE_US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def from_us_opt(us: int | None) -> datetime | None:
    return None if us is None else EPOCH + timedelta(microseconds=us)


def dumps(value: Any) -> str:
    return _encoder.encode(value).decode()


def loads(text: str) -> Any:
    return _any.decode(text)


def claim_of(thread_id: str, holder: str | None, token: int | None, expires: int | None) -> Claim:
    assert holder is not None and token is not None and expires is not None
    return Claim(thread_id=thread_id, holder=holder, token=token, expires_at=from_us(expires))


DISPATCH_COLUMNS = (
    "dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts, dedupe_key, "
    "status, attempts, token, holder, lease_until, last_error, created_at, updated_at, tenant, "
    "if_busy, queued_behind, coalesced, answered_by, pinned_version, released_from, "
    "debounce_key, concurrency_key, concurrency_limit, fair_tag"
)
"""The columns ``dispatch_of`` reads, in its order."""


def dispatch_of(row: tuple[Any, ...]) -> Dispatch:
    (
        dispatch_id,
        thread_id,
        kind,
        payload,
        priority,
        available_at,
        max_attempts,
        dedupe_key,
        status,
        attempts,
        token,
        holder,
        lease_until,
        last_error,
        created_at,
        updated_at,
        tenant,
        if_busy,
        queued_behind,
        coalesced,
        answered_by,
        pinned_version,
        released_from,
        debounce_key,
        concurrency_key,
        concurrency_limit,
        fair_tag,
    ) = row
    return Dispatch(
        dispatch_id=dispatch_id,
        thread_id=thread_id,
        kind=kind,
        payload=loads(payload),
        priority=priority,
        available_at=from_us(available_at),
        max_attempts=max_attempts,
        dedupe_key=dedupe_key,
        status=status,
        attempts=attempts,
        token=token,
        holder=holder,
        lease_until=from_us_opt(lease_until),
        last_error=last_error,
        created_at=from_us(created_at),
        updated_at=from_us(updated_at),
        tenant=tenant,
        if_busy=if_busy,
        queued_behind=queued_behind,
        coalesced=tuple(loads(coalesced)) if coalesced else (),
        answered_by=answered_by,
        pinned_version=pinned_version,
        released_from=released_from,
        debounce_key=debounce_key,
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit,
        fair_tag=fair_tag,
    )
