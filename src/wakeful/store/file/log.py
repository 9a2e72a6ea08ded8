"""``commits.ndjson``: replay (with the chain, torn-tail and corruption rules) and the appender.

Layout: line 1 is a ``LogHeader`` frame; every further line is one record (see ``chain``), in
the order the mutations were applied. Replay applies them to a ``State``.

Rules, all checked before anything is changed on disk (``scan_log`` only reads):
  - a complete (newline-terminated) line that is not a valid frame, fails its checksum, does
    not decode, breaks the chain (a gap, a repeat, a reorder, a record from another log) or
    does not apply to the state before it is corruption: ``CorruptStore(path, offset, line,
    ...)``;
  - the bytes after the last complete line (the tail) are accepted as a torn append only if
    a crash in the middle of a write could have left them: they begin like a record (or with
    NULs: blocks a power loss did not write) and do not reach past the end of the write they
    began (the ``batch_end`` their first bytes name, or ``MAX_WRITE_BYTES`` when too little
    of them survived to tell). Anything else, a zero-filled run over several writes included,
    is corruption;
  - a log without a complete header line is accepted (as torn) only when its bytes are the
    beginning of a header the store could have written: a zero-filled log is corruption.
Whether a torn tail was ever acknowledged is not known from the file: an interrupted write
leaves such a tail unacknowledged, but a disk that zeroed the end of the last record leaves
the same bytes. So the opener keeps them beside the log before cutting them (``root``).

A version 1 log (unchained records) is replayed without the chain checks; its tail can only be
bounded by ``MAX_WRITE_BYTES``. The opener upgrades it right after (``root``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import msgspec

from wakeful.errors import CorruptStore
from wakeful.store.file.chain import (
    ENTRY_DECODER,
    MAX_WRITE_BYTES,
    ChainPosition,
    encode_write,
    link,
    split_writes,
    torn_batch_end,
)
from wakeful.store.file.codec import (
    FORMAT_VERSION,
    FRAME_HEAD,
    LOG_FORMAT,
    LOG_NAME,
    LOG_VERSION,
    LOG_VERSIONS,
    FrameError,
    LogHeader,
    encode_header,
    unframe,
)
from wakeful.store.file.fsutil import Fault, no_fault, replace_durably, write_all
from wakeful.store.projection import Mutation, State

CHUNK = 8 * 1024 * 1024

_MUTATIONS = msgspec.json.Decoder(Mutation)
_HEADER = msgspec.json.Decoder(LogHeader)


def header_line(generation: int, version: int = LOG_VERSION) -> bytes:
    header = LogHeader(format=LOG_FORMAT, version=version, generation=generation)
    return encode_header(header)


@dataclass(frozen=True)
class LogScan:
    """What replay found. ``status``: ``missing`` (no file), ``torn_header`` (the file is a
    proper prefix of a header line, ``tail`` holds it), ``superseded`` (the log precedes the
    snapshot: a compaction installed the snapshot but not yet its fresh log; the records are
    all in the snapshot and were not replayed), ``ok`` (``records`` replayed up to
    ``valid_end``, where the chain stands at ``position``; ``tail`` holds the torn bytes
    after it, if any). ``version`` is the log's format version (None unless ``ok``)."""

    status: Literal["missing", "torn_header", "superseded", "ok"]
    generation: int | None
    size: int
    valid_end: int
    records: int
    position: ChainPosition
    tail: bytes = b""
    version: int | None = None


def scan_log(path: Path, state: State, snapshot_generation: int, anchor: str) -> LogScan:
    """Replay ``path`` into ``state`` (which holds the snapshot of ``snapshot_generation``,
    whose link is ``anchor``). Reads only; raises ``CorruptStore`` on the first violation of
    the rules above."""
    start = ChainPosition(0, anchor)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        return LogScan("missing", None, 0, 0, 0, start)
    with f:
        size = os.fstat(f.fileno()).st_size
        reader = _LineReader(path, f)
        lines = iter(reader)
        first = next(lines, None)
        if first is None:
            if not _could_be_torn_header(reader.tail, snapshot_generation):
                raise CorruptStore(
                    str(path),
                    0,
                    1,
                    f"the log has no complete header line and its {size} bytes are not the "
                    f"beginning of one{_nul_note(reader.tail)}: a crash cannot leave that "
                    f"(the header is written whole), the file was overwritten or zero-filled",
                )
            return LogScan("torn_header", None, size, 0, 0, start, reader.tail)
        header = _header(path, first[1])
        if header.generation == snapshot_generation - 1:
            return LogScan("superseded", header.generation, size, size, 0, start)
        if header.generation != snapshot_generation:
            raise CorruptStore(
                str(path),
                0,
                1,
                f"log generation {header.generation} does not continue the snapshot's "
                f"generation {snapshot_generation} (a file was replaced or is missing)",
            )
        replay = _Replay(path, state, header.version, start)
        end = len(first[1]) + 1
        for number, (offset, line) in enumerate(lines, start=2):
            replay.apply(offset, number, line)
            end = offset + len(line) + 1
        if reader.tail:
            _check_torn(path, end, replay.records + 2, reader.tail, header.version)
        return LogScan(
            "ok",
            header.generation,
            size,
            end,
            replay.records,
            replay.position,
            reader.tail,
            header.version,
        )


class _LineReader:
    """Complete lines of a log as (offset, bytes without the newline); once iterated,
    ``tail`` holds the bytes after the last newline. More than ``MAX_WRITE_BYTES`` without a
    newline is ``CorruptStore``: no record and no write is that long."""

    def __init__(self, path: Path, f: BinaryIO) -> None:
        self._path = path
        self._f = f
        self.tail = b""

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        carry, offset, number = b"", 0, 1
        while chunk := self._f.read(CHUNK):
            parts = (carry + chunk if carry else chunk).split(b"\n")
            carry = parts.pop()
            for part in parts:
                yield offset, part
                offset += len(part) + 1
                number += 1
            if len(carry) > MAX_WRITE_BYTES:
                raise CorruptStore(
                    str(self._path),
                    offset,
                    number,
                    f"more than {MAX_WRITE_BYTES} bytes without a newline{_nul_note(carry)}: "
                    f"longer than any record or write",
                )
        self.tail = carry


class _Replay:
    """Applies the records of one log to ``state``, checking the chain (version 2)."""

    def __init__(self, path: Path, state: State, version: int, start: ChainPosition) -> None:
        self.path = path
        self.state = state
        self.chained = version != FORMAT_VERSION
        self.position = start
        self.records = 0

    def apply(self, offset: int, number: int, line: bytes) -> None:
        record = (
            self._chained(offset, number, line)
            if self.chained
            else self._plain(offset, number, line)
        )
        try:
            self.state.apply(record)
        except Exception as exc:
            raise self._corrupt(
                offset, number, f"the record does not apply to the state before it ({exc!r})"
            ) from exc
        self.records += 1

    def _plain(self, offset: int, number: int, line: bytes) -> Mutation:
        try:
            record: Mutation = _MUTATIONS.decode(unframe(line))
        except (FrameError, msgspec.DecodeError) as exc:
            raise self._corrupt(offset, number, f"invalid record: {exc}") from exc
        return record

    def _chained(self, offset: int, number: int, line: bytes) -> Mutation:
        try:
            entry = ENTRY_DECODER.decode(unframe(line))
        except (FrameError, msgspec.DecodeError) as exc:
            raise self._corrupt(offset, number, f"invalid record: {exc}") from exc
        expected = self.position.seq + 1
        if entry.seq > expected:
            missing = (
                f"record {expected} is"
                if entry.seq == expected + 1
                else f"records {expected} to {entry.seq - 1} are"
            )
            raise self._corrupt(
                offset,
                number,
                f"record {entry.seq} stands where record {expected} belongs: {missing} "
                f"missing here (lost, deleted or moved later)",
            )
        if entry.seq < expected:
            raise self._corrupt(
                offset,
                number,
                f"record {entry.seq} stands where record {expected} belongs: it repeats an "
                f"earlier record or was moved here from later in the log",
            )
        if entry.prev != self.position.link:
            what = "the snapshot" if expected == 1 else f"record {expected - 1}"
            raise self._corrupt(
                offset,
                number,
                f"record {entry.seq} does not continue {what} (its link {entry.prev} is "
                f"not {self.position.link}): it comes from another log or what it follows "
                f"was replaced",
            )
        if entry.batch_end < offset + len(line) + 1:
            raise self._corrupt(
                offset, number, f"the record's batch_end {entry.batch_end} lies before its end"
            )
        self.position = ChainPosition(entry.seq, link(line, b"\n"))
        return entry.mutation

    def _corrupt(self, offset: int, number: int, detail: str) -> CorruptStore:
        return CorruptStore(str(self.path), offset, number, detail)


def _check_torn(path: Path, offset: int, number: int, tail: bytes, version: int) -> None:
    """Raise ``CorruptStore`` unless ``tail`` (the bytes after the last complete line, at
    ``offset``) is what an interrupted write can leave."""
    if tail[:1] != b"\0" and tail[: len(FRAME_HEAD)] != FRAME_HEAD[: len(tail)]:
        raise CorruptStore(
            str(path),
            offset,
            number,
            f"the log ends with {len(tail)} bytes without a newline that do not begin like a "
            f"record{_nul_note(tail)}: an interrupted write cannot leave them",
        )
    reach, why = offset + MAX_WRITE_BYTES, f"the largest write ({MAX_WRITE_BYTES} bytes)"
    stated = torn_batch_end(tail) if version == LOG_VERSION else None
    if stated is not None and stated < reach:
        reach, why = stated, f"the end of the write it began, offset {stated}"
    if offset + len(tail) > reach:
        raise CorruptStore(
            str(path),
            offset,
            number,
            f"the log ends with {len(tail)} bytes without a newline{_nul_note(tail)}, reaching "
            f"past {why}: an interrupted write cannot leave them, so acknowledged records "
            f"there were overwritten (e.g. zero-filled)",
        )


def _could_be_torn_header(data: bytes, snapshot_generation: int) -> bool:
    generations = {snapshot_generation, max(snapshot_generation - 1, 0)}
    return any(
        header_line(generation, version).startswith(data)
        for generation in generations
        for version in LOG_VERSIONS
    )


def _nul_note(data: bytes) -> str:
    if data and not data.strip(b"\0"):
        return " (all NUL bytes)"
    return " (with NUL bytes)" if b"\0" in data else ""


def _header(path: Path, line: bytes) -> LogHeader:
    try:
        header = _HEADER.decode(unframe(line))
    except (FrameError, msgspec.DecodeError) as exc:
        raise CorruptStore(str(path), 0, 1, f"invalid log header: {exc}") from exc
    if header.format != LOG_FORMAT:
        raise CorruptStore(str(path), 0, 1, f"not a wakeful log (format {header.format!r})")
    if header.version not in LOG_VERSIONS:
        raise CorruptStore(
            str(path),
            0,
            1,
            f"log format version {header.version} is not supported by this version of "
            f"wakeful (it reads versions {', '.join(map(str, LOG_VERSIONS))})",
        )
    return header


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


@dataclass(frozen=True, slots=True)
class PreparedAppend:
    """The chained, framed writes of one append (``LogWriter.prepare``): prepared against the
    durable length ``start``, they bring the log to ``end`` with its chain at ``position``."""

    start: int
    writes: tuple[bytes, ...]
    end: int
    position: ChainPosition


class LogWriter:
    """The open log file. ``size`` is the durable length: every byte below it was fsynced;
    ``position`` is where the chain stands at ``size``. Everything that touches the file runs
    on the store's IO thread; ``prepare`` only reads ``size`` and ``position`` (the store
    calls it on its event loop while no append is in flight)."""

    def __init__(
        self,
        path: Path,
        fd: int,
        size: int,
        generation: int,
        position: ChainPosition,
        fault: Fault,
    ) -> None:
        self.path = path
        self.size = size
        self.generation = generation
        self.position = position
        self.fault = fault
        """The crash hook of ``append`` (``log.after_write``, ``log.after_fsync``)."""
        self._fd = fd

    @classmethod
    def open(
        cls,
        path: Path,
        size: int,
        generation: int,
        position: ChainPosition,
        fault: Fault = no_fault,
    ) -> LogWriter:
        # O_APPEND: after a failed append is truncated away, the next write lands at the
        # new end without any seek bookkeeping.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return cls(path, fd, size, generation, position, fault)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def prepare(self, bodies: Sequence[bytes]) -> PreparedAppend:
        """Chain and frame ``bodies`` (encoded mutations, in order) into the writes that
        append them after ``size``: one write, or one per ``MAX_WRITE_BYTES`` for a batch
        larger than that. Pure: it reads ``size`` and ``position`` and changes nothing, so it
        may run on any thread while no ``write`` is in flight (the store prepares on its event
        loop, which holds the GIL anyway, so that the IO thread goes from its wake-up straight
        to the ``write``). Raises ``ValueError`` for a record larger than one write."""
        size, position = self.size, self.position
        writes: list[bytes] = []
        for run in split_writes(bodies):
            data, position = encode_write(run, size, position)
            writes.append(data)
            size += len(data)
        return PreparedAppend(self.size, tuple(writes), size, position)

    def write(self, prepared: PreparedAppend) -> int:
        """Write and fsync what ``prepare`` made, each write fsynced before the next; returns
        the bytes written. Refuses (``ValueError``, nothing written) a preparation made
        against another durable length: its chain would not continue this log's. On an
        exception nothing may be assumed about the bytes past ``size``: call
        ``truncate_to_durable``."""
        if prepared.start != self.size:
            raise ValueError(
                f"an append prepared at offset {prepared.start} cannot be written at "
                f"{self.size}: it was prepared before another append or a truncation"
            )
        for data in prepared.writes:
            write_all(self._fd, data)
            self.fault("log.after_write")
            os.fsync(self._fd)
            self.fault("log.after_fsync")
        self.size, self.position = prepared.end, prepared.position
        return prepared.end - prepared.start

    def append(self, bodies: Sequence[bytes]) -> int:
        """``write(prepare(bodies))``, on the calling thread."""
        return self.write(self.prepare(bodies))

    def truncate_to_durable(self) -> None:
        """Remove whatever a failed append left past ``size``, durably."""
        os.ftruncate(self._fd, self.size)
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
