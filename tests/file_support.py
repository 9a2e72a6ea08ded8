"""Helpers for the file store's log tests: a log written through the real store, its lines
and records read independently of the store's reader, and a fingerprint of a whole root."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec

from tests.file_child import mixed_workload
from wakeful.clock import ManualClock
from wakeful.store.file import open_file_store
from wakeful.store.projection import Mutation

LOG = "commits.ndjson"


def line_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of every complete line, ``end`` just past its newline."""
    spans, start = [], 0
    while (newline := data.find(b"\n", start)) >= 0:
        spans.append((start, newline + 1))
        start = newline + 1
    return spans


def records_of(data: bytes) -> list[Mutation]:
    """The mutations of a chained log, decoded independently of the store's reader."""
    decoder = msgspec.json.Decoder(Mutation)
    return [
        decoder.decode(msgspec.json.encode(json.loads(line)["m"]["mutation"]))
        for line in data.splitlines()[1:]
    ]


async def written_log(root: Path, rounds: int = 2, tag: str = "") -> bytes:
    """The log of a fresh root after ``rounds`` of the mixed workload, closed."""
    clock = ManualClock()
    store = await open_file_store(root.as_uri(), clock=clock, compact_bytes=None)
    await mixed_workload(store, clock, rounds=rounds, tag=tag)
    await store.close()
    return (root / LOG).read_bytes()


def with_record(data: bytes, mutation: bytes) -> bytes:
    """``data`` (a chained log of generation 0, ending with a newline) plus one correctly
    chained record carrying ``mutation`` (its JSON)."""
    # Imported here so the regression tests that do not use this helper also run (and fail)
    # against the code from before the chain.
    from wakeful.store.file.chain import GENESIS, ChainPosition, encode_write, link

    lines = data.splitlines(keepends=True)
    if len(lines) == 1:
        position = ChainPosition(0, GENESIS)
    else:
        position = ChainPosition(json.loads(lines[-1])["m"]["seq"], link(lines[-1]))
    written, _ = encode_write([mutation], len(data), position)
    return data + written


def fingerprint(root: Path) -> dict[str, str]:
    """The SHA-256 of every file under ``root`` but the lock file (whose content is the
    opener's pid, rewritten by every opener)."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != "wakeful.lock"
    }
