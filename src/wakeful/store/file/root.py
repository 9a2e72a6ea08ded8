"""The files of a store root, which of them win on open, and how compaction replaces them.

A root holds ``snapshot.json`` (generation ``S``, absent means ``S = 0`` and an empty
state) and ``commits.ndjson`` (its header names generation ``L``). The rule on open:

  - ``L == S``: the snapshot plus the log's records are the state;
  - ``L == S - 1``: a compaction installed snapshot ``S`` but crashed before installing its
    fresh log; log ``L`` holds nothing the snapshot lacks (the store writes nothing to a log
    between taking the snapshot and switching logs), so the opener installs the fresh log;
  - anything else (or a snapshot without a log) is ``CorruptStore``: some file was removed or
    replaced by hand.

Compaction writes the new snapshot and the new log as temp files, fsyncs both, renames the
snapshot into place (the commit point), fsyncs the directory, renames the log into place and
fsyncs the directory again. A crash before the commit point leaves ``(S, L=S)`` plus stray
temp files (removed by the next open); after it ``(S+1, L=S)`` or ``(S+1, L=S+1)``. Each of
those opens to the same state. Directory fsyncs order the two renames, so the log rename
can never survive without the snapshot rename.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wakeful.errors import CorruptStore
from wakeful.store.file.chain import GENESIS, ChainPosition, link
from wakeful.store.file.codec import (
    FORMAT_VERSION,
    LOG_NAME,
    LOG_VERSION,
    SNAPSHOT_NAME,
    TMP_SUFFIX,
    TORN_INFIX,
)
from wakeful.store.file.fsutil import Fault, fsync_dir, keep_aside, no_fault, write_synced
from wakeful.store.file.log import LogWriter, create_log, header_line, scan_log, truncate_durably
from wakeful.store.file.snapshot import encode_state, read_snapshot, snapshot_bytes
from wakeful.store.projection import State

logger = logging.getLogger("wakeful.store.file")

COMPACTION_STEPS = (
    "compact.begin",
    "compact.snapshot_written",
    "compact.snapshot_synced",
    "compact.log_written",
    "compact.log_synced",
    "compact.snapshot_renamed",
    "compact.snapshot_dir_synced",
    "compact.log_renamed",
    "compact.log_dir_synced",
)
"""Every point of compaction where a test can inject a crash, in order."""


@dataclass
class Loaded:
    """An opened root: the replayed state and the writer positioned after it."""

    state: State
    generation: int
    snapshot_size: int
    writer: LogWriter
    records: int


def load_root(root: Path, fault: Fault = no_fault) -> Loaded:
    """Read the snapshot and replay the log, then repair what a crash may have left (torn
    tail, unfinished compaction, temp files) and upgrade a version 1 log. Every check runs
    before the first repair, so a ``CorruptStore`` leaves every file exactly as it was. No
    repair destroys bytes that were not saved: a torn tail is kept beside the log first."""
    log_path, snap_path = root / LOG_NAME, root / SNAPSHOT_NAME
    generation, state, snapshot_size, anchor = 0, State(), 0, GENESIS
    if snap_path.exists():
        generation, state, snapshot_size, anchor = read_snapshot(snap_path)
    scan = scan_log(log_path, state, generation, anchor)
    if scan.status == "missing" and generation > 0:
        raise CorruptStore(
            str(log_path), None, None, f"the log is missing but {SNAPSHOT_NAME} exists"
        )
    # ---- validated; repairs from here on
    if scan.tail:
        _keep_torn(log_path, scan.valid_end, scan.tail)
    if scan.status == "ok":
        size, position = scan.valid_end, scan.position
        if scan.size > size:
            truncate_durably(log_path, size)
    else:
        if scan.status == "superseded":
            logger.warning(
                "%s: finishing an interrupted compaction (snapshot generation %d is "
                "installed, its fresh log was not)",
                log_path,
                generation,
            )
        elif scan.status == "torn_header" and not scan.tail:
            logger.warning("%s: the log is empty; starting it again", log_path)
        size, position = create_log(root, generation), ChainPosition(0, anchor)
    _remove_temp_files(root)
    if scan.status == "ok" and scan.version != LOG_VERSION:
        return _upgrade(root, state, generation, scan.records, fault)
    writer = LogWriter.open(log_path, size, generation, position, fault)
    return Loaded(state, generation, snapshot_size, writer, scan.records)


def _keep_torn(log_path: Path, offset: int, tail: bytes) -> None:
    """Save a torn tail beside the log (fsynced) before it is cut, and say so."""
    kept = keep_aside(log_path.with_name(f"{LOG_NAME}{TORN_INFIX}{offset}"), tail)
    logger.warning(
        "%s: cut %d bytes at offset %d that do not end a record (a torn append; not "
        "acknowledged if the process crashed mid-write), kept in %s",
        log_path,
        len(tail),
        offset,
        kept,
    )


def _upgrade(root: Path, state: State, generation: int, records: int, fault: Fault) -> Loaded:
    """Replace a version 1 (unchained) log by a snapshot of ``state`` and a fresh chained
    log, through a regular compaction (crash-safe at every step: a crash before its commit
    point leaves the version 1 log, which the next open upgrades again)."""
    body = encode_state(state)
    writer = Compaction(root, body, generation + 1, fault).run()
    logger.warning(
        "%s: upgraded the log from format version %d to %d (compacted into snapshot generation %d)",
        root / LOG_NAME,
        FORMAT_VERSION,
        LOG_VERSION,
        generation + 1,
    )
    return Loaded(state, generation + 1, len(body), writer, records)


def _remove_temp_files(root: Path) -> None:
    removed = False
    for name in (SNAPSHOT_NAME, LOG_NAME):
        try:
            os.unlink(root / (name + TMP_SUFFIX))
            removed = True
        except FileNotFoundError:
            pass
    if removed:
        fsync_dir(root)


class Compaction:
    """Replace the root's snapshot and log by a snapshot of ``body`` (an encoded state that
    is already durable in the current log) and an empty log, as generation ``generation``.

    ``committed`` turns true once the snapshot rename is done: from then on the old log must
    not receive another append (a reopen may discard it), whatever happens next."""

    def __init__(self, root: Path, body: bytes, generation: int, fault: Fault) -> None:
        self.root = root
        self.body = body
        self.generation = generation
        self.fault = fault
        self.committed = False

    def run(self) -> LogWriter:
        """All the steps; blocking. Raises ``OSError`` (temp files removed when not yet
        committed) or whatever ``fault`` raises (nothing cleaned up: a crash)."""
        root, fault = self.root, self.fault
        snap, log = root / SNAPSHOT_NAME, root / LOG_NAME
        snap_tmp, log_tmp = root / (SNAPSHOT_NAME + TMP_SUFFIX), root / (LOG_NAME + TMP_SUFFIX)
        header = header_line(self.generation)
        fault("compact.begin")
        try:
            snapshot = snapshot_bytes(self.body, self.generation)
            write_synced(snap_tmp, snapshot, fault, "compact.snapshot")
            write_synced(log_tmp, header, fault, "compact.log")
            os.replace(snap_tmp, snap)
        except OSError:
            _quietly(_remove_temp_files, root)
            raise
        self.committed = True
        fault("compact.snapshot_renamed")
        fsync_dir(root)
        fault("compact.snapshot_dir_synced")
        os.replace(log_tmp, log)
        fault("compact.log_renamed")
        fsync_dir(root)
        fault("compact.log_dir_synced")
        return LogWriter.open(
            log, len(header), self.generation, ChainPosition(0, link(snapshot)), fault
        )


def _quietly(action: Callable[[Path], None], root: Path) -> None:
    try:
        action(root)
    except OSError as exc:
        logger.warning("%s: could not remove compaction temp files: %s", root, exc)
