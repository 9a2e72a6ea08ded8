"""``commits.ndjson``: replay (with the torn-tail and corruption rules) and the appender.

Layout: line 1 is a ``LogHeader`` frame; every further line is one ``Mutation`` frame (see
``codec``), in the order the mutations were applied. Replay applies them to a ``State``.

Recovery rules, checked before anything is changed on disk:
  - a final line without its newline is a torn append: it was never acknowledged (the
    acknowledgement waits for the fsync of the whole line), so the opener truncates it;
  - a newline-terminated line that is not a valid frame, fails its checksum, does not decode
    as a mutation or does not apply is corruption: ``CorruptStore(path, offset, line, ...)``
    and the file is left exactly as it was, torn tail included.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import msgspec

from wakeful.errors import CorruptStore
from wakeful.store.file.codec import (
    FORMAT_VERSION,
    LOG_FORMAT,
    LOG_NAME,
    FrameError,
    LogHeader,
    encode_header,
    frame,
    unframe,
)
from wakeful.store.file.fsutil import Fault, no_fault, replace_durably, write_all
from wakeful.store.projection import Mutation, State

CHUNK = 8 * 1024 * 1024

_ENCODER = msgspec.json.Encoder()
_MUTATIONS = msgspec.json.Decoder(Mutation)
_HEADER = msgspec.json.Decoder(LogHeader)


def encode_record(record: Mutation) -> bytes:
    """The log line of one mutation, newline included."""
    return frame(_ENCODER.encode(record))


def header_line(generation: int) -> bytes:
    header = LogHeader(format=LOG_FORMAT, version=FORMAT_VERSION, generation=generation)
    return encode_header(header)


@dataclass(frozen=True)
class LogScan:
    """What replay found. ``status``: ``missing`` (no file), ``torn_header`` (not even the
    header line is complete), ``superseded`` (the log precedes the snapshot: a compaction
    installed the snapshot but not yet its fresh log; the records are all in the snapshot
    and were not replayed), ``ok`` (records replayed up to ``valid_end``)."""

    status: Literal["missing", "torn_header", "superseded", "ok"]
    generation: int | None
    size: int
    valid_end: int
    records: int


def scan_log(path: Path, state: State, snapshot_generation: int) -> LogScan:
    """Replay ``path`` into ``state`` (which holds the snapshot of ``snapshot_generation``).
    Reads only; raises ``CorruptStore`` on the first invalid complete line."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        return LogScan("missing", None, 0, 0, 0)
    with f:
        size = os.fstat(f.fileno()).st_size
        lines = _lines(f)
        first = next(lines, None)
        if first is None:
            return LogScan("torn_header", None, size, 0, 0)
        header = _header(path, first[1])
        if header.generation == snapshot_generation - 1:
            return LogScan("superseded", header.generation, size, size, 0)
        if header.generation != snapshot_generation:
            raise CorruptStore(
                str(path),
                0,
                1,
                f"log generation {header.generation} does not continue the snapshot's "
                f"generation {snapshot_generation} (a file was replaced or is missing)",
            )
        end, count = len(first[1]) + 1, 0
        for number, (offset, line) in enumerate(lines, start=2):
            record = _record(path, offset, number, line)
            try:
                state.apply(record)
            except Exception as exc:
                raise CorruptStore(
                    str(path),
                    offset,
                    number,
                    f"the record does not apply to the state before it ({exc!r})",
                ) from exc
            end = offset + len(line) + 1
            count += 1
        return LogScan("ok", header.generation, size, end, count)


def _lines(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """Complete lines as (offset, bytes without the newline); a torn tail is not yielded."""
    carry, offset = b"", 0
    while chunk := f.read(CHUNK):
        parts = (carry + chunk if carry else chunk).split(b"\n")
        carry = parts.pop()
        for part in parts:
            yield offset, part
            offset += len(part) + 1


def _header(path: Path, line: bytes) -> LogHeader:
    try:
        header = _HEADER.decode(unframe(line))
    except (FrameError, msgspec.DecodeError) as exc:
        raise CorruptStore(str(path), 0, 1, f"invalid log header: {exc}") from exc
    if header.format != LOG_FORMAT:
        raise CorruptStore(str(path), 0, 1, f"not a wakeful log (format {header.format!r})")
    if header.version != FORMAT_VERSION:
        raise CorruptStore(
            str(path),
            0,
            1,
            f"log format version {header.version} is not supported by this version of "
            f"wakeful (it reads version {FORMAT_VERSION})",
        )
    return header


def _record(path: Path, offset: int, number: int, line: bytes) -> Mutation:
    try:
        record: Mutation = _MUTATIONS.decode(unframe(line))
    except (FrameError, msgspec.DecodeError) as exc:
        raise CorruptStore(str(path), offset, number, f"invalid record: {exc}") from exc
    return record


def create_log(root: Path, generation: int) -> int:
    """Atomically install an empty log (just its header) for ``generation``; returns its
    size."""
    line = header_line(generation)
    replace_durably(root / LOG_NAME, line)
    return len(line)


def truncate_durably(path: Path, size: int) -> None:
    """Cut ``path`` to ``size`` bytes and fsync the cut."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


class LogWriter:
    """The open log file. ``size`` is the durable length: every byte below it was fsynced.
    Used only from the store's IO thread."""

    def __init__(self, path: Path, fd: int, size: int, generation: int, fault: Fault) -> None:
        self.path = path
        self.size = size
        self.generation = generation
        self.fault = fault
        """The crash hook of ``append`` (``log.after_write``, ``log.after_fsync``)."""
        self._fd = fd

    @classmethod
    def open(cls, path: Path, size: int, generation: int, fault: Fault = no_fault) -> LogWriter:
        # O_APPEND: after a failed append is truncated away, the next write lands at the
        # new end without any seek bookkeeping.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return cls(path, fd, size, generation, fault)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def append(self, data: bytes) -> None:
        """Write ``data`` (whole lines) and fsync once. On an exception nothing may be
        assumed about the bytes past ``size``: call ``truncate_to_durable``."""
        write_all(self._fd, data)
        self.fault("log.after_write")
        os.fsync(self._fd)
        self.fault("log.after_fsync")
        self.size += len(data)

    def truncate_to_durable(self) -> None:
        """Remove whatever a failed append left past ``size``, durably."""
        os.ftruncate(self._fd, self.size)
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
