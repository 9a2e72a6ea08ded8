"""The framing shared by every line the file store writes, and the file names of a root.

Every line of ``commits.ndjson`` and ``snapshot.json`` is one JSON object in a fixed layout::

    {"c":"<crc>","m":<body>}\\n

where ``<body>`` is a JSON value and ``<crc>`` is the CRC-32 of exactly the bytes of
``<body>``, as 8 lowercase hex digits. The layout is fixed (the checksum first, then the
body, nothing else), so a reader checks the frame and the checksum without parsing the body,
and any JSON tool can still read the file. A checksum is what turns a flipped byte inside a
string or a number (which would still be valid JSON) into a detected corruption.

Format versions: the first line of each file is a header naming the format and its version.
Snapshots are version 1 (``FORMAT_VERSION``). The log is version 2 (``LOG_VERSION``: every
record is chained, see ``chain``); a version 1 log (unchained records, written before the
chain existed) is still read, once, and upgraded on open. A reader refuses a version it does
not know instead of guessing.
"""

from __future__ import annotations

import zlib

import msgspec

LOG_NAME = "commits.ndjson"
SNAPSHOT_NAME = "snapshot.json"
LOCK_NAME = "wakeful.lock"
STREAM_DIR = "stream-checkpoints"
TMP_SUFFIX = ".tmp"
TORN_INFIX = ".torn-"
"""Torn bytes cut from the end of the log are kept as ``commits.ndjson.torn-<offset>``."""

LOG_FORMAT = "wakeful.file-log"
SNAPSHOT_FORMAT = "wakeful.file-snapshot"
FORMAT_VERSION = 1
"""The snapshot's version, and the version of the unchained log written before issue 16."""
LOG_VERSION = 2
"""The chained log (each record carries its sequence number, its write's end and a link)."""
LOG_VERSIONS = (FORMAT_VERSION, LOG_VERSION)

_HEAD = b'{"c":"'
_MID = b'","m":'
_PREFIX = len(_HEAD) + 8 + len(_MID)
FRAME_HEAD = _HEAD
"""The first bytes of every line: a torn record begins with (a prefix of) them."""
FRAME_OVERHEAD = _PREFIX + 2
"""The bytes a frame adds to its body (checksum, keys, closing brace, newline)."""


class LogHeader(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Line 1 of ``commits.ndjson``. ``generation`` pairs the log with the snapshot it
    continues (0: no snapshot)."""

    format: str
    version: int
    generation: int


class SnapshotHeader(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Line 1 of ``snapshot.json``; line 2 is the encoded state. The snapshot of generation
    ``N`` holds everything written to the logs of generations below ``N``."""

    format: str
    version: int
    generation: int


class FrameError(ValueError):
    """A line is not a valid frame (what is wrong is the message)."""


def frame(body: bytes) -> bytes:
    """One newline-terminated line carrying ``body`` (a JSON value without newlines)."""
    return b"".join((_HEAD, b"%08x" % zlib.crc32(body), _MID, body, b"}\n"))


def frame_parts(*parts: bytes) -> bytes:
    """``frame(b"".join(parts))``, without joining the body first."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return b"".join((_HEAD, b"%08x" % crc, _MID, *parts, b"}\n"))


def unframe(line: bytes) -> bytes:
    """The body of one line (without its newline). Raises ``FrameError``."""
    if len(line) <= _PREFIX or not line.startswith(_HEAD) or line[-1:] != b"}":
        raise FrameError('not a {"c":...,"m":...} record')
    if line[len(_HEAD) + 8 : _PREFIX] != _MID:
        raise FrameError('not a {"c":...,"m":...} record')
    body = line[_PREFIX:-1]
    if line[len(_HEAD) : len(_HEAD) + 8] != b"%08x" % zlib.crc32(body):
        raise FrameError("checksum mismatch: the record's bytes changed after it was written")
    return body


def encode_header(header: LogHeader | SnapshotHeader) -> bytes:
    return frame(msgspec.json.encode(header))
