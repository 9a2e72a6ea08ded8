"""Fsynced JSON-lines files: what child processes report to the parent (acknowledgements,
grants, side effects, injected faults).

Each record is one ``write`` of one line followed by ``fsync``, written *after* the fact it
reports (an acknowledgement is logged once the store call returned): a process killed in
between simply reports less. A reader ignores a torn final line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def append(path: Path, record: dict[str, Any]) -> None:
    data = (json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    """Every complete line of ``path`` (none if it does not exist)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in raw.split(b"\n")[:-1] if line]


def read_all(directory: Path, prefix: str) -> list[dict[str, Any]]:
    """The records of every ``<prefix>*.jsonl`` file in ``directory``."""
    records: list[dict[str, Any]] = []
    for path in sorted(directory.glob(f"{prefix}*.jsonl")):
        records += read(path)
    return records
