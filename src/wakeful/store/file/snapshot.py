"""``snapshot.json``: the whole ``State`` as JSON, and reading it back.

The file has two frames (see ``codec``): a ``SnapshotHeader`` line and one line holding the
state. ``encode_state`` / ``decode_state`` are explicit: every field of ``State`` and
``ThreadState`` is written, sets as sorted lists, dicts whose key is a field of their value
(writes by task id, inbox by message id, dispatches by id, workers by id) as lists in the
dict's order, so ``decode_state(encode_state(s)) == s`` and iteration orders survive.
Nothing is pickled.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import msgspec

from wakeful.errors import CorruptStore
from wakeful.records import (
    Branch,
    Checkpoint,
    Claim,
    Dispatch,
    Event,
    InboxMessage,
    Message,
    OutboxEntry,
    PendingWrite,
    Receipt,
    Schedule,
    WorkerInfo,
)
from wakeful.store.file.chain import link
from wakeful.store.file.codec import (
    FORMAT_VERSION,
    SNAPSHOT_FORMAT,
    FrameError,
    SnapshotHeader,
    encode_header,
    frame,
    unframe,
)
from wakeful.store.projection import StagedEntry, State, ThreadState


class _Thread(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    thread_id: str
    version: int
    tenant: str | None
    claim: Claim | None
    history: list[tuple[Checkpoint, datetime]]
    checkpoint_ids: list[str]
    writes: list[PendingWrite]
    events: list[Event]
    floor: int
    messages: list[Message]
    message_ids: list[str]
    receipts: dict[str, tuple[str, Receipt, datetime]]
    inbox: list[InboxMessage]
    delivered: list[str]
    inbox_revision: int
    updated_at: datetime | None
    orders: list[int] | None = None
    """Each checkpoint's commit order (``None`` in a snapshot older than branches: then
    the positions, which order the same way)."""
    branches: list[Branch] = []
    branch_orders: list[int] = []


class _Staged(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    stage_seq: int
    source_thread: str
    entry: OutboxEntry
    at: datetime


class _State(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    threads: list[_Thread]
    epochs: dict[str, int]
    dispatches: list[Dispatch]
    dispatch_order: dict[str, int]
    dispatch_seq: int
    dedupe: dict[str, str]
    open_by_thread: dict[str, list[str]]
    outbox: list[_Staged]
    stage_seq: int
    workers: list[WorkerInfo]
    schedules: list[Schedule] = msgspec.field(default_factory=list)
    """Absent from snapshots written before schedules existed."""


_STATE = msgspec.json.Decoder(_State)
_HEADER = msgspec.json.Decoder(SnapshotHeader)


def encode_state(state: State) -> bytes:
    """The JSON of the whole projection. Reads ``state`` without awaiting: call it on the
    event loop that owns the state."""
    doc = _State(
        threads=[_thread_doc(t) for t in state.threads.values()],
        epochs=state.epochs,
        dispatches=list(state.dispatches.values()),
        dispatch_order=state.dispatch_order,
        dispatch_seq=state.dispatch_seq,
        dedupe=state.dedupe,
        open_by_thread={tid: sorted(ids) for tid, ids in state.open_by_thread.items()},
        outbox=[
            _Staged(stage_seq=seq, source_thread=s.source_thread, entry=s.entry, at=s.at)
            for seq, s in state.outbox.items()
        ],
        stage_seq=state.stage_seq,
        workers=list(state.workers.values()),
        schedules=list(state.schedules.values()),
    )
    return msgspec.json.encode(doc)


def decode_state(body: bytes) -> State:
    """The inverse of ``encode_state``. Raises ``msgspec.DecodeError`` on invalid input."""
    doc = _STATE.decode(body)
    return State(
        threads={t.thread_id: _thread_state(t) for t in doc.threads},
        epochs=doc.epochs,
        dispatches={d.dispatch_id: d for d in doc.dispatches},
        dispatch_order=doc.dispatch_order,
        dispatch_seq=doc.dispatch_seq,
        dedupe=doc.dedupe,
        open_by_thread={tid: set(ids) for tid, ids in doc.open_by_thread.items()},
        outbox={s.stage_seq: StagedEntry(s.source_thread, s.entry, s.at) for s in doc.outbox},
        stage_seq=doc.stage_seq,
        workers={w.worker_id: w for w in doc.workers},
        schedules={s.name: s for s in doc.schedules},
    )


def _thread_doc(t: ThreadState) -> _Thread:
    return _Thread(
        thread_id=t.thread_id,
        version=t.version,
        tenant=t.tenant,
        claim=t.claim,
        history=t.history,
        checkpoint_ids=sorted(t.checkpoint_ids),
        writes=list(t.writes.values()),
        events=t.events,
        floor=t.floor,
        messages=t.messages,
        message_ids=sorted(t.message_ids),
        receipts=t.receipts,
        inbox=list(t.inbox.values()),
        delivered=sorted(t.delivered),
        inbox_revision=t.inbox_revision,
        updated_at=t.updated_at,
        orders=t.orders,
        branches=t.branches,
        branch_orders=t.branch_orders,
    )


def _thread_state(doc: _Thread) -> ThreadState:
    orders = doc.orders if doc.orders is not None else list(range(1, len(doc.history) + 1))
    return ThreadState(
        thread_id=doc.thread_id,
        version=doc.version,
        tenant=doc.tenant,
        claim=doc.claim,
        history=doc.history,
        checkpoint_ids=set(doc.checkpoint_ids),
        writes={w.task_id: w for w in doc.writes},
        events=doc.events,
        floor=doc.floor,
        messages=doc.messages,
        message_ids=set(doc.message_ids),
        receipts=doc.receipts,
        inbox={m.message_id: m for m in doc.inbox},
        delivered=set(doc.delivered),
        inbox_revision=doc.inbox_revision,
        updated_at=doc.updated_at,
        orders=orders,
        cp_order={cp.id: o for (cp, _), o in zip(doc.history, orders, strict=True)},
        branches=doc.branches,
        branch_orders=doc.branch_orders,
    )


# ------------------------------------------------------------------ the file


def snapshot_bytes(body: bytes, generation: int) -> bytes:
    """The content of a snapshot file for an encoded state."""
    header = SnapshotHeader(format=SNAPSHOT_FORMAT, version=FORMAT_VERSION, generation=generation)
    return encode_header(header) + frame(body)


class SnapshotFile(NamedTuple):
    """A snapshot file read back: its ``generation``, ``state``, ``size`` in bytes and
    ``link`` (``chain.link`` of its bytes: what the first record of its log continues)."""

    generation: int
    state: State
    size: int
    link: str


def read_snapshot(path: Path) -> SnapshotFile:
    """Read a snapshot file. A snapshot is only ever installed complete (temp file, fsync,
    rename), so anything wrong with it, a missing newline or a run of NUL bytes included, is
    ``CorruptStore``: there is no torn snapshot."""
    data = path.read_bytes()
    first = data.find(b"\n")
    if first < 0 or not data.endswith(b"\n") or data.count(b"\n") != 2:
        nul = " (it holds NUL bytes: zero-filled)" if b"\0" in data else ""
        raise CorruptStore(
            str(path), 0, 1, f"a snapshot is exactly two complete lines, this is not{nul}"
        )
    try:
        header = _HEADER.decode(unframe(data[:first]))
    except (FrameError, msgspec.DecodeError) as exc:
        raise CorruptStore(str(path), 0, 1, f"invalid snapshot header: {exc}") from exc
    if header.format != SNAPSHOT_FORMAT or header.version != FORMAT_VERSION:
        raise CorruptStore(
            str(path),
            0,
            1,
            f"snapshot format {header.format!r} version {header.version} is not supported "
            f"(this version of wakeful reads {SNAPSHOT_FORMAT!r} version {FORMAT_VERSION})",
        )
    try:
        state = decode_state(unframe(data[first + 1 : -1]))
    except (FrameError, msgspec.DecodeError) as exc:
        raise CorruptStore(str(path), first + 1, 2, f"invalid snapshot state: {exc}") from exc
    return SnapshotFile(header.generation, state, len(data), link(data))
