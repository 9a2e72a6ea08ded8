"""The chain of ``commits.ndjson`` (log format version 2): what a record carries besides its
mutation, so that replay notices a record that was lost, repeated, moved or brought in from
another log, and knows how long the write that carried it was.

A record is one frame (see ``codec``) whose body has this fixed key order::

    {"batch_end":E,"seq":N,"prev":"<32 hex>","mutation":{...}}

- ``seq``: the record's position in its log, 1 for the first record after the header.
- ``prev``: the link of what the record continues: for record N > 1 the link of record N-1's
  whole line (newline included), for record 1 the link of the snapshot file the log
  continues, or ``GENESIS`` when there is no snapshot. A link is the first 32 hex digits
  (128 bits) of a SHA-256.
- ``batch_end``: the log offset where the write that carried the record ends (group commit
  writes many records with one ``write``). It comes first so that even a short torn prefix
  of a record tells how far its write reached, which bounds a torn tail (see ``log``).

A write never exceeds ``MAX_WRITE_BYTES`` (a larger batch is written as several writes, each
fsynced before the next), so that is also the bound of a torn tail whose own bytes do not tell.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import msgspec

from wakeful.records import Claim, Receipt
from wakeful.store.file.codec import FRAME_OVERHEAD, frame_parts
from wakeful.store.projection import Committed, Mutation, Settled
from wakeful.store.validate import MAX_COMMIT_BYTES

GENESIS = "0" * 32
"""The link record 1 of a log continues when there is no snapshot (a fresh store)."""

MAX_WRITE_BYTES = 2 * MAX_COMMIT_BYTES
"""The most one ``write`` puts in the log: twice the largest commit, which is more than any
single record can be (a record is a commit plus a small envelope of claim and outcome)."""

_LINK_HEX = 32
_BEFORE_END = b'{"batch_end":'
_BEFORE_SEQ = b',"seq":'
_BEFORE_PREV = b',"prev":"'
_BEFORE_MUTATION = b'","mutation":'
_ENVELOPE = (
    FRAME_OVERHEAD
    + len(_BEFORE_END)
    + len(_BEFORE_SEQ)
    + len(_BEFORE_PREV)
    + _LINK_HEX
    + len(_BEFORE_MUTATION)
    + 1  # the closing brace of the body
)
"""The bytes of a record line besides its mutation and the digits of its two numbers."""
_MOST_DIGITS = 20
_TORN_START = re.compile(rb'\{"c":"[0-9a-f]{8}","m":\{"batch_end":([0-9]{1,20}),')

_ENCODER = msgspec.json.Encoder()


class Entry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of one record line."""

    batch_end: int
    seq: int
    prev: str
    mutation: Mutation


ENTRY_DECODER = msgspec.json.Decoder(Entry)


@dataclass(frozen=True)
class ChainPosition:
    """Where a log's chain stands: ``seq`` of its last record (0: none yet) and the ``link``
    the next record must carry as ``prev``."""

    seq: int
    link: str


def link(*parts: bytes) -> str:
    """The link of a record line (newline included) or of a whole snapshot file, given as
    the concatenation of ``parts``."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()[:_LINK_HEX]


def encode_mutation(record: Mutation) -> bytes:
    """The JSON of one mutation: what the store hands to the log writer."""
    return _ENCODER.encode(record)


class _CommittedWire(msgspec.Struct, frozen=True, tag="committed"):
    """``Committed`` as written, its commit given as its checked encoding (the same fields
    in the same order: the same bytes)."""

    thread_id: str
    commit: msgspec.Raw
    receipt: Receipt
    payload_hash: str
    at: datetime
    claim: Claim | None = None
    settled: Settled | None = None


def encode_committed(record: Committed, commit_body: bytes) -> bytes:
    """``encode_mutation(record)``, given ``commit_body``, the JSON of ``record.commit``."""
    wire = _CommittedWire(
        record.thread_id,
        msgspec.Raw(commit_body),
        record.receipt,
        record.payload_hash,
        record.at,
        record.claim,
        record.settled,
    )
    return _ENCODER.encode(wire)


def split_writes(bodies: Sequence[bytes]) -> list[Sequence[bytes]]:
    """``bodies`` (encoded mutations, in order) cut into consecutive runs that each make one
    write of at most ``MAX_WRITE_BYTES``. Raises ``ValueError`` for a record that alone is
    larger (validation keeps every record far below it)."""
    runs: list[Sequence[bytes]] = []
    first, size = 0, 0
    for i, body in enumerate(bodies):
        line = len(body) + _ENVELOPE + 2 * _MOST_DIGITS
        if line > MAX_WRITE_BYTES:
            raise ValueError(
                f"a log record of about {line} bytes exceeds the largest write the log allows "
                f"({MAX_WRITE_BYTES} bytes); it was not written"
            )
        if size + line > MAX_WRITE_BYTES:
            runs.append(bodies[first:i])
            first, size = i, 0
        size += line
    if first < len(bodies):
        runs.append(bodies[first:])
    return runs


def encode_write(
    bodies: Sequence[bytes], start: int, position: ChainPosition
) -> tuple[bytes, ChainPosition]:
    """The lines of one write of ``bodies`` at log offset ``start`` after ``position``, and the
    position after them. Every line carries the write's end offset, which depends on its own
    digit count: the count is found first (a fixed point reached in a step or two)."""
    count = len(bodies)
    if not count:
        return b"", position
    first = position.seq + 1
    # The lines' bytes besides the end offset's digits (seq digits summed without a
    # generator for the common single record: a sequential commit is a batch of one).
    seq_digits = (
        len(str(first)) if count == 1 else sum(map(len, map(str, range(first, first + count))))
    )
    rest = _ENVELOPE * count + seq_digits + sum(map(len, bodies))
    digits = 1
    while (found := len(str(start + rest + digits * count))) != digits:
        digits = found
    end = start + rest + digits * count
    lines: list[bytes] = []
    prev = position.link
    seq = first
    for body in bodies:
        head = b"%s%d%s%d%s%s%s" % (
            _BEFORE_END,
            end,
            _BEFORE_SEQ,
            seq,
            _BEFORE_PREV,
            prev.encode(),
            _BEFORE_MUTATION,
        )
        # ``frame(head + body + b"}")`` without building that body: the checksum runs over
        # its parts in order and the line is joined once.
        line = frame_parts(head, body, b"}")
        lines.append(line)
        prev = link(line)
        seq += 1
    data = lines[0] if count == 1 else b"".join(lines)
    assert len(data) == end - start, "the envelope length is computed from the same layout"
    return data, ChainPosition(seq - 1, prev)


def torn_batch_end(tail: bytes) -> int | None:
    """The ``batch_end`` a torn record's first bytes name, or None if too little of it
    survived (or it is not the beginning of a record)."""
    found = _TORN_START.match(tail)
    return int(found.group(1)) if found else None
