"""Rows to records and records to the JSON text the schema stores.

Bodies are msgspec JSON kept as ``text``; the columns next to them hold what the server
decides (sequence numbers, times, tokens) and what queries filter on.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

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
    "status, attempts, token, holder, lease_until, last_error, created_at, updated_at, tenant, "
    "if_busy, queued_behind, coalesced, answered_by, pinned_version, released_from, "
    "debounce_key, concurrency_key, concurrency_limit, fair_tag"
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
    branch: int = 0,
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
        branch=branch,
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
        if_busy=row[17],
        queued_behind=row[18],
        coalesced=tuple(row[19]),
        answered_by=row[20],
        pinned_version=row[21],
        released_from=row[22],
        debounce_key=row[23],
        concurrency_key=row[24],
        concurrency_limit=row[25],
        fair_tag=row[26],
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


# Array parameters in PostgreSQL's binary array format, built here in one pass. psycopg's own
# list dumper (Python) inspects every list for its element type twice, then dumps it element
# by element through a dumper per element (decision 0022, sixth round). A parameter wrapped
# in one of these classes has its type known up front: one dumper per class, registered
# below on psycopg's global adapters (the classes are this module's own, so no other value
# is affected). Elements may be None (SQL NULL).

_HEAD = struct.Struct(">iiiii").pack
_EMPTY = struct.Struct(">iii").pack
_LENGTH = struct.Struct(">i").pack
_NULL = _LENGTH(-1)
_PACKED = 64
"""Arrays of a fixed-size type up to this long without nulls are packed by one ``Struct``."""


class PgArray:
    """A one-dimensional array parameter of a fixed element type (a subclass per type)."""

    __slots__ = ("items",)
    element_oid = 0

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.items!r})"

    def binary(self) -> bytes:
        raise NotImplementedError  # pragma: no cover


class TextArray(PgArray):
    """``text[]`` of ``str`` (UTF-8, the schema's client encoding)."""

    __slots__ = ()
    element_oid = 25

    def binary(self) -> bytes:
        items = self.items
        if not items:
            return _EMPTY(0, 0, 25)
        if None not in items:  # the usual case: one comprehension, no branch per element
            return _utf8_array(list(map(str.encode, items)))
        parts = []
        for s in items:
            if s is None:
                parts.append(_NULL)
            else:
                b = s.encode()
                parts.append(_LENGTH(len(b)))
                parts.append(b)
        return _HEAD(1, 1, 25, len(items), 1) + b"".join(parts)


class Utf8Array(PgArray):
    """``text[]`` of ``bytes`` already UTF-8 (a JSON body as encoded: no decode and
    re-encode per element); no NULLs."""

    __slots__ = ()
    element_oid = 25

    def binary(self) -> bytes:
        return _utf8_array(self.items) if self.items else _EMPTY(0, 0, 25)


def _utf8_array(items: Sequence[bytes]) -> bytes:
    """A non-empty one-dimensional ``text[]`` without NULLs, of UTF-8 elements."""
    body = b"".join([_LENGTH(len(b)) + b for b in items])
    return _HEAD(1, 0, 25, len(items), 1) + body


def _fixed(element_oid: int, code: str, doc: str) -> type[PgArray]:
    size = struct.calcsize(">" + code)
    pack = struct.Struct(">i" + code).pack
    packers: dict[int, Any] = {}  # a struct per length up to _PACKED

    def binary(self: PgArray) -> bytes:
        items = self.items
        n = len(items)
        if not n:
            return _EMPTY(0, 0, element_oid)
        try:
            if n <= _PACKED and None not in items:  # one struct call for the whole array
                packer = packers.get(n)
                if packer is None:
                    packer = packers[n] = struct.Struct(">5i" + ("i" + code) * n).pack
                values: list[Any] = [size, 0] * n
                values[1::2] = items
                return packer(1, 0, element_oid, n, 1, *values)
            parts = [_NULL if v is None else pack(size, v) for v in items]
        except struct.error as exc:
            raise psycopg.DataError(f"array element out of range: {exc}") from None
        return _HEAD(1, int(None in items), element_oid, n, 1) + b"".join(parts)

    attrs = {"__slots__": (), "__doc__": doc, "element_oid": element_oid, "binary": binary}
    return type(f"PgArray{element_oid}", (PgArray,), attrs)


Int4Array = _fixed(23, "i", "``int4[]`` of ``int``.")
Int8Array = _fixed(20, "q", "``int8[]`` of ``int``.")
Float8Array = _fixed(701, "d", "``float8[]`` of ``float`` (or ``int``).")
BoolArray = _fixed(16, "?", "``bool[]`` of ``bool``.")
ARRAYS: dict[str, type[PgArray]] = {
    "text": TextArray,
    "int4": Int4Array,
    "int8": Int8Array,
    "bigint": Int8Array,
    "float8": Float8Array,
    "bool": BoolArray,
}
"""The array class of each element type name."""


def _register(cls: type[PgArray], array_oid: int) -> None:
    class _Dumper(Dumper):
        format = Format.BINARY
        oid = array_oid

        def dump(self, obj: Any) -> bytes:
            return obj.binary()  # type: ignore[no-any-return]

    psycopg.adapters.register_dumper(cls, _Dumper)


for _cls, _oid in ((TextArray, 1009), (Utf8Array, 1009), (Int4Array, 1007), (Int8Array, 1016)):
    _register(_cls, _oid)
_register(Float8Array, 1022)
_register(BoolArray, 1000)
