"""Copying threads from a LangGraph saver's database into a wakeful store (``wakeful
langgraph import``).

Each source thread becomes the LangGraph thread of the same id on a ``WakefulSaver``: its
checkpoints (every namespace, oldest first) and pending writes, with their ids, parents,
metadata, channel versions, task ids, indexes and paths, so the saver answers as the source
saver did. Values keep the source serializer's encoding (plain JSON values are stored as
themselves, as the saver stores them); a pickled value is refused unless ``allow_pickle``.

Resumable and incremental: a thread is written in commits of at most ``batch_bytes``, each
holding whole checkpoints with their writes, and only what the wakeful thread does not
already have is written. An interrupted import, run again, adds the rest; run after the
source moved on, it adds the new checkpoints and writes. What the wakeful thread already has
is never overwritten, and a thread that has checkpoints the source does not (it has run on
wakeful since it was imported) is left alone (``diverged``): merging two histories would
change which checkpoint is its latest. Each commit claims the thread for its atomic step
only, so a thread a live process holds is skipped (``busy``) and the rest go on.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from wakeful.errors import (
    InvalidInput,
    InvalidState,
    NotFound,
    StaleClaim,
    ThreadBusy,
    VersionConflict,
)
from wakeful.langgraph.codec import PICKLE, is_plain_json
from wakeful.langgraph.index import ThreadIndex
from wakeful.langgraph.saver import WakefulSaver
from wakeful.langgraph.sources import Source, SourceThread, Typed, raw_unpack

BATCH_BYTES = 4 * 1024 * 1024
"""The largest commit the import builds (the store refuses commits over 16 MiB): a bigger
thread takes several commits, each whole checkpoints with their writes."""
RETRIES = 3
"""Attempts per commit when another writer changed the thread meanwhile."""


class ImportSummary(msgspec.Struct, kw_only=True):
    """What an import did. ``skipped``: thread -> why nothing (more) of it was written."""

    source: str
    threads: int = 0
    """Threads read from the source."""
    imported: int = 0
    """Threads that got at least one checkpoint or write."""
    unchanged: int = 0
    """Threads whose every checkpoint and write the store already had."""
    checkpoints: int = 0
    writes: int = 0
    commits: int = 0
    skipped: dict[str, str] = msgspec.field(default_factory=dict)
    seconds: float = 0.0


ThreadDone = Callable[[str, str], None]
"""Called after each thread with its id and outcome (imported, unchanged, busy, refused)."""


async def import_threads(
    source: Source,
    saver: WakefulSaver,
    *,
    threads: Sequence[str] | None = None,
    allow_pickle: bool = False,
    batch_bytes: int = BATCH_BYTES,
    on_thread: ThreadDone | None = None,
    on_count: Callable[[int], None] | None = None,
) -> ImportSummary:
    """Import every thread of ``source`` (or only ``threads``) through ``saver``. Raises
    ``NotFound`` for a named thread the source lacks (before importing anything) and
    ``InvalidInput`` for a value the import must not or cannot carry (a pickle without
    ``allow_pickle``, an unreadable checkpoint); what was committed before stays."""
    started = time.monotonic()
    summary = ImportSummary(source=source.description)
    ids = await source.thread_ids()
    if threads is not None:
        missing = sorted(set(threads) - set(ids))
        if missing:
            raise NotFound("source thread", ", ".join(missing))
        wanted = set(threads)
        ids = [t for t in ids if t in wanted]
    if on_count is not None:
        on_count(len(ids))
    for thread_id in ids:
        items = thread_items(await source.read(thread_id), saver, allow_pickle)
        outcome = await _import_one(saver, thread_id, items, batch_bytes, summary)
        summary.threads += 1
        if on_thread is not None:
            on_thread(thread_id, outcome)
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


async def _import_one(
    saver: WakefulSaver,
    thread_id: str,
    items: list[list[dict[str, Any]]],
    batch_bytes: int,
    summary: ImportSummary,
) -> str:
    added = [0, 0]
    known = {(item["ns"], item["id"]) for group in items for item in group if item["k"] == "c"}
    try:
        for batch in batches(items, batch_bytes):
            for attempt in range(RETRIES):
                try:
                    new = await _commit_missing(saver, thread_id, batch, known)
                    break
                except (VersionConflict, StaleClaim):
                    # Another writer committed meanwhile: forget the fenced state, re-read.
                    await saver.release(thread_id)
                    if attempt == RETRIES - 1:
                        raise
            if new:
                summary.commits += 1
                added[0] += sum(1 for item in new if item["k"] == "c")
                added[1] += sum(1 for item in new if item["k"] == "w")
    except ThreadBusy as exc:
        summary.skipped[thread_id] = str(exc)
        outcome = "busy"
    except (InvalidState, VersionConflict, StaleClaim) as exc:
        summary.skipped[thread_id] = str(exc)
        outcome = "refused"
    else:
        outcome = "imported" if any(added) else "unchanged"
    summary.checkpoints += added[0]
    summary.writes += added[1]
    if any(added):
        summary.imported += 1
    elif outcome == "unchanged":
        summary.unchanged += 1
    return outcome


async def _commit_missing(
    saver: WakefulSaver,
    thread_id: str,
    batch: list[dict[str, Any]],
    known: set[tuple[str, str]],
) -> list[dict[str, Any]]:
    """Commit the items of ``batch`` the thread lacks, as one record; return them. Refuses
    a thread with a checkpoint outside ``known`` (the source's)."""
    new: list[dict[str, Any]] = []

    def build(idx: ThreadIndex) -> tuple[list[dict[str, Any]], list[str]] | None:
        if not set(idx.checkpoints) <= known:
            raise InvalidState(
                "thread",
                thread_id,
                "diverged",
                "it has checkpoints the source does not (it ran on wakeful since it was "
                "imported); it is left as it is",
            )
        new[:] = [item for item in batch if not idx.holds(item)]
        return (list(new), []) if new else None

    # The saver's own fenced write path (package-internal): one commit, one claim.
    await saver._write(thread_id, build)
    return new


def batches(groups: list[list[dict[str, Any]]], limit: int) -> list[list[dict[str, Any]]]:
    """Groups (a checkpoint with its writes) packed in order into batches of at most
    ``limit`` encoded bytes; a group bigger than that is a batch of its own."""
    out: list[list[dict[str, Any]]] = []
    size = 0
    for group in groups:
        weight = sum(len(msgspec.json.encode(item)) for item in group)
        if not out or size + weight > limit:
            out.append([])
            size = 0
        out[-1].extend(group)
        size += weight
    return out


def thread_items(
    thread: SourceThread, saver: WakefulSaver, allow_pickle: bool
) -> list[list[dict[str, Any]]]:
    """The thread as the saver's record items, grouped: each checkpoint (oldest first) with
    its writes, then writes whose checkpoint is missing."""

    def value(stored: Any, what: str) -> dict[str, Any]:
        return encode(saver, stored, f"thread {thread.thread_id!r}: {what}", allow_pickle)

    writes: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for w in thread.writes:
        writes.setdefault((w.ns, w.checkpoint_id), []).append(
            {
                "k": "w",
                "ns": w.ns,
                "cid": w.checkpoint_id,
                "task": w.task_id,
                "idx": w.idx,
                "channel": w.channel,
                "value": value(w.value, f"write of task {w.task_id!r} to {w.channel!r}"),
                "path": w.task_path,
            }
        )
    groups: list[list[dict[str, Any]]] = []
    for c in thread.checkpoints:
        where = f"checkpoint {c.id!r}"
        item = {
            "k": "c",
            "ns": c.ns,
            "id": c.id,
            "parent": c.parent,
            "checkpoint": value(c.body, where),
            "values": {k: value(v, f"{where} channel {k!r}") for k, v in c.values.items()},
            "metadata": value(c.metadata, f"{where} metadata"),
        }
        groups.append([item, *writes.pop((c.ns, c.id), [])])
    for key in sorted(writes):
        groups.append(writes[key])
    return groups


def encode(saver: WakefulSaver, stored: Any, what: str, allow_pickle: bool) -> dict[str, Any]:
    """A source value as the saver stores it: plain JSON as itself (through the saver's
    codec), a serialized value as its type and bytes, unchanged."""
    if not isinstance(stored, Typed):
        return saver.codec.encode(stored, what)
    if stored.kind == PICKLE and not allow_pickle:
        raise InvalidInput(
            what,
            "the value is pickled, and a pickle runs code when it is read; rerun with "
            "--allow-pickle if every writer of the source was trusted (read the store with "
            "WakefulSaver(..., allow_pickle=True))",
        )
    if stored.kind == "null":
        return saver.codec.encode(None, what)
    if stored.kind == "msgpack" and saver.codec.plain_json:
        try:
            decoded = raw_unpack(stored.data)
        except ValueError as exc:
            raise InvalidInput(what, f"the stored msgpack does not decode: {exc}") from None
        if is_plain_json(decoded):
            return {"j": decoded}
    return {"t": stored.kind, "b": base64.b64encode(stored.data).decode("ascii")}
