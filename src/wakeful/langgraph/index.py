"""One LangGraph thread as a fold of its wakeful records.

Every saver mutation of a LangGraph thread (or several ``put``/``put_writes`` calls that
arrived together) is one wakeful commit that appends one wakeful checkpoint, a *record*, to
the wakeful thread of the same id. A record's ``state`` is::

    {"langgraph": 1, "thread": <LangGraph thread id>, "items": [...], "drop": [<record ids>],
     "head": {<namespace>: <its newest checkpoint id>}}

with items of two kinds: a checkpoint ``{"k": "c", "ns", "id", "parent", "checkpoint",
"values", "metadata"}`` and a pending write ``{"k": "w", "ns", "cid", "task", "idx",
"channel", "value", "path"}`` (values encoded by ``ValueCodec``). ``drop`` names the records
the same commit removed with ``Commit.drop_checkpoints`` (``prune`` and ``delete_for_runs``
rewrite the survivors of dropped records into the new one), so an index folded up to an
older record can catch up by reading only the records after it.

``head`` (added by decision 0030; records written before it lack it and still fold) names
each namespace's newest checkpoint once the record is applied: a cold read of the latest
checkpoint folds only the records from the one holding that checkpoint to the newest
(``catch_up``), not the thread's history, and an index keeps only the newest checkpoints
(``ThreadIndex.trim``). Such an index is *partial* (``complete`` false): what needs the
whole thread (``list``, a rewrite, an older checkpoint) folds it anew first.

Folding is order-insensitive for the effective data: a checkpoint put twice keeps the later
item; a pending write keeps the first item for a task's regular index and the later one for
the special (negative) indexes, exactly as LangGraph's own savers upsert them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from wakeful.records import Checkpoint, ThreadSnapshot
from wakeful.store.contract import ThreadStore

RECORD_FORMAT = 1
PAGE = 100
KEEP = 16
"""How many checkpoints (the newest, with their writes) a trimmed index keeps."""

CheckpointKey = tuple[str, str]
"""(checkpoint_ns, checkpoint_id)"""
WriteKey = tuple[str, int]
"""(task_id, idx)"""


def is_record(state: Any) -> bool:
    return isinstance(state, dict) and state.get("langgraph") == RECORD_FORMAT


def record_state(
    thread_id: str, items: list[dict[str, Any]], drop: list[str], head: dict[str, str]
) -> dict[str, Any]:
    return {
        "langgraph": RECORD_FORMAT,
        "thread": thread_id,
        "items": items,
        "drop": drop,
        "head": head,
    }


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class Entry(msgspec.Struct, gc=False):
    """One effective item and the record holding it. The item is kept as its JSON bytes:
    detached from the caller that wrote it, and one object where the decoded item is dozens
    the garbage collector would traverse at every full collection for as long as the thread
    stays cached (at 8 concurrent runs those traversals cost more CPU than encoding does).
    Not tracked by the collector at all (``gc=False``): an entry holds bytes, a string and
    decoded JSON, never a reference back to anything that could close a cycle, and a
    cached thread's entries (a dozen per run of a 3-node graph) were most of what a run
    left for every full collection to traverse."""

    raw: bytes
    record: str
    decoded_metadata: dict[str, Any] | None = None
    """The checkpoint's metadata once a filter asked for it (``metadata``); decoded on
    demand, not at every write: most entries are never filtered, and an undecoded entry is
    one object less for the collector."""

    def metadata(self, decode: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """The checkpoint's metadata for filters, detached (``decode`` decodes it from the
        item, which is a fresh copy already), kept once decoded."""
        if self.decoded_metadata is None:
            self.decoded_metadata = decode(self.item)
        return self.decoded_metadata

    @property
    def item(self) -> dict[str, Any]:
        """A fresh copy of the item (the caller may change it)."""
        item: dict[str, Any] = _decode(self.raw)
        return item


@dataclass
class ThreadIndex:
    """What the saver knows of one thread: checkpoints and writes by key, each with the
    record that holds it. ``version`` is the store's thread version this view matches
    (``-1``: unknown, re-read before trusting it)."""

    thread_id: str | None = None
    version: int = 0
    latest_record: str | None = None
    foreign: bool = False
    """The wakeful thread holds records that are not a LangGraph saver's (a wakeful runtime
    thread of the same id): the saver reads nothing from it and refuses to write to it."""
    checkpoints: dict[CheckpointKey, Entry] = field(default_factory=dict)
    writes: dict[CheckpointKey, dict[WriteKey, Entry]] = field(default_factory=dict)
    latest: dict[str, str] = field(default_factory=dict)
    """namespace -> its newest checkpoint id (LangGraph ids sort by creation time), for
    every namespace of the thread, even in a partial index."""
    complete: bool = True
    """The index holds every checkpoint and write of the thread; otherwise only the newest
    checkpoints, each with all its writes (see the module doc)."""
    floor: str = ""
    """Checkpoints with ids from this one up, and their writes, are all in the index
    (``""``: every one, the index is complete)."""

    def fold(self, record_id: str, state: Any) -> None:
        """Apply one record, newer than every record folded so far. The index keeps copies
        (the items' JSON): ``state`` may be the caller's objects."""
        self.latest_record = record_id
        if not is_record(state):
            self.foreign = True
            return
        self.thread_id = state["thread"]
        if state["drop"]:
            self.forget(set(state["drop"]))
        for item in state["items"]:
            if item["k"] == "c":
                key = (item["ns"], item["id"])
                self.checkpoints[key] = Entry(_encode(item), record_id)
                if item["id"] > self.latest.get(item["ns"], ""):
                    self.latest[item["ns"]] = item["id"]
            else:
                slot = self.writes.setdefault((item["ns"], item["cid"]), {})
                wkey = (item["task"], item["idx"])
                if wkey[1] < 0 or wkey not in slot:
                    slot[wkey] = Entry(_encode(item), record_id)
        head = state.get("head")
        if head is not None:  # authoritative, also for namespaces a partial index lacks
            self.latest = dict(head)

    def head_after(self, items: list[dict[str, Any]], drop: list[str]) -> dict[str, str]:
        """``latest`` once a record of ``items`` dropping the records ``drop`` is folded
        (a record's ``head``). A drop is computed on a complete index (rewrites are)."""
        if drop:
            dropped = set(drop)
            latest: dict[str, str] = {}
            for (ns, cid), entry in self.checkpoints.items():
                if entry.record not in dropped and cid > latest.get(ns, ""):
                    latest[ns] = cid
        else:
            latest = dict(self.latest)
        for item in items:
            if item["k"] == "c" and item["id"] > latest.get(item["ns"], ""):
                latest[item["ns"]] = item["id"]
        return latest

    def trim(self, keep: int = KEEP) -> None:
        """Keep only the newest ``keep`` checkpoints (and each namespace's newest), with
        their writes, once the index holds twice as many: memory stays bounded however
        long the thread's history grows. The index is then partial."""
        if len(self.checkpoints) <= 2 * keep:
            return
        ordered = sorted(self.checkpoints, key=lambda k: k[1])
        newest = set(ordered[-keep:])
        newest.update(self.latest.items())
        floor = ordered[-keep][1]
        for key in [k for k in self.checkpoints if k not in newest]:
            del self.checkpoints[key]
        for key in [k for k in self.writes if k not in newest and k[1] < floor]:
            del self.writes[key]
        self.complete = False
        self.floor = max(self.floor, floor)

    def lacks(self, key: CheckpointKey) -> bool:
        """True if the thread may hold writes of checkpoint ``key`` this index does not."""
        return key[1] < self.floor and key not in self.checkpoints

    def lacks_writes_of(self, arg: Any) -> bool:
        """True for a ``put_writes`` append (``write_items``' ``arg``) to a checkpoint
        older than this partial index holds: which of its writes are new is known only to
        the whole thread's index."""
        return isinstance(arg, tuple) and self.lacks((arg[0], arg[1]))

    def forget(self, records: set[str]) -> None:
        """Drop every entry held by one of ``records``."""
        for key in [k for k, e in self.checkpoints.items() if e.record in records]:
            del self.checkpoints[key]
        for ckey, slot in list(self.writes.items()):
            for wkey in [k for k, e in slot.items() if e.record in records]:
                del slot[wkey]
            if not slot:
                del self.writes[ckey]
        if not self.complete:
            return  # ``latest`` comes from the records' heads
        self.latest = {}
        for ns, cid in self.checkpoints:
            if cid > self.latest.get(ns, ""):
                self.latest[ns] = cid

    def records(self) -> set[str]:
        held = {e.record for e in self.checkpoints.values()}
        for slot in self.writes.values():
            held.update(e.record for e in slot.values())
        return held

    def items(self, keep: Any = None) -> list[dict[str, Any]]:
        """Every effective item (checkpoints with their writes), optionally only the
        checkpoints ``keep(key, entry)`` accepts and their writes; oldest checkpoint first."""
        chosen: list[dict[str, Any]] = []
        for key in sorted(self.checkpoints, key=lambda k: k[1]):
            entry = self.checkpoints[key]
            if keep is not None and not keep(key, entry):
                continue
            chosen.append(entry.item)
            chosen.extend(e.item for e in self.writes.get(key, {}).values())
        if keep is None:
            # writes whose checkpoint was never put (LangGraph allows it) travel too
            orphans = set(self.writes) - set(self.checkpoints)
            for key in sorted(orphans):
                chosen.extend(e.item for e in self.writes[key].values())
        return chosen

    def holds(self, item: dict[str, Any]) -> bool:
        """True if this thread already has the checkpoint or write ``item`` (by its key)."""
        if item["k"] == "c":
            return (item["ns"], item["id"]) in self.checkpoints
        return (item["task"], item["idx"]) in self.writes.get(item_key(item), {})

    def is_empty(self) -> bool:
        return not self.checkpoints and not self.writes

    def without(
        self, remove: Callable[[ThreadIndex, CheckpointKey], bool], *, orphans: bool
    ) -> tuple[list[dict[str, Any]], list[str]] | None:
        """The record that removes the checkpoints ``remove`` picks (with their writes;
        with ``orphans`` also writes whose checkpoint was never put): its items are the
        survivors of every record holding something removed, and it drops those records.
        ``None`` when nothing is removed."""
        gone = {k for k in self.checkpoints if remove(self, k)}
        if orphans:
            gone |= set(self.writes) - set(self.checkpoints)
        hit: set[str] = set()
        for key in gone:
            if key in self.checkpoints:
                hit.add(self.checkpoints[key].record)
            hit.update(e.record for e in self.writes.get(key, {}).values())
        if not hit:
            return None
        survivors = [
            item
            for item in self.items()
            if item_key(item) not in gone and self._record_of(item) in hit
        ]
        return survivors, sorted(hit)

    def _record_of(self, item: dict[str, Any]) -> str:
        key = item_key(item)
        if item["k"] == "c":
            return self.checkpoints[key].record
        return self.writes[key][(item["task"], item["idx"])].record


def item_key(item: dict[str, Any]) -> CheckpointKey:
    """The checkpoint an item is (``c``) or belongs to (``w``)."""
    return (item["ns"], item["id"] if item["k"] == "c" else item["cid"])


def _holds_checkpoint(state: Any, ns: str, cid: str) -> bool:
    return any(i["k"] == "c" and i["ns"] == ns and i["id"] == cid for i in state["items"])


async def _latest_only(store: ThreadStore, snap: ThreadSnapshot) -> ThreadIndex | None:
    """A partial index of the records from the one holding the newest checkpoint of the
    root namespace to the newest (``snap``'s), or ``None`` when the newest record has no
    ``head`` (written before decision 0030) or the walk finds something unexpected."""
    newest = snap.checkpoint
    assert newest is not None
    head = newest.state.get("head") if is_record(newest.state) else None
    target = head.get("") if isinstance(head, dict) else None
    if target is None:
        return None
    records = [newest]
    found = _holds_checkpoint(newest.state, "", target)
    before, limit = newest.id, 4  # a run's last few records, then pages growing to PAGE
    while not found:
        page = await store.checkpoints(snap.thread_id, before=before, limit=limit)
        for record, _ in page:
            if not is_record(record.state):
                return None
            records.append(record)
            if _holds_checkpoint(record.state, "", target):
                found = True
                break
        if found or len(page) < limit:
            break
        before, limit = page[-1][0].id, min(limit * 4, PAGE)
    if not found:
        return None
    idx = ThreadIndex(complete=False, floor=target)
    for record in reversed(records):
        idx.fold(record.id, record.state)
    idx.version = snap.version
    return idx


async def catch_up(
    store: ThreadStore,
    snap: ThreadSnapshot | None,
    cached: ThreadIndex | None,
    *,
    complete: bool = False,
) -> ThreadIndex:
    """The index of the thread ``snap`` was read from: ``cached`` advanced by the records
    committed after its latest one, or (when that record is gone: dropped by a rewrite, or
    nothing was cached) a partial index of the newest records (``complete`` false and the
    newest record has a ``head``) or one folded anew from the whole history."""
    if snap is None or snap.checkpoint is None:
        return ThreadIndex(version=snap.version if snap else 0)
    if cached is None and not complete:
        partial = await _latest_only(store, snap)
        if partial is not None:
            return partial
    stop = cached.latest_record if cached is not None else None
    newer: list[Checkpoint] = []
    found = snap.checkpoint.id == stop
    if not found:
        newer.append(snap.checkpoint)
        before = snap.checkpoint.id
        while True:
            page = await store.checkpoints(snap.thread_id, before=before, limit=PAGE)
            for record, _ in page:
                if record.id == stop:
                    found = True
                    break
                newer.append(record)
            if found or len(page) < PAGE:
                break
            before = page[-1][0].id
    idx = cached if cached is not None and found else ThreadIndex()
    for record in reversed(newer):
        idx.fold(record.id, record.state)
    idx.version = snap.version
    return idx


def given(idx: ThreadIndex, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``put``'s record items, made before its batch (they do not depend on the index)."""
    return items


def write_items(
    encode: Callable[..., dict[str, Any]],
    idx: ThreadIndex,
    arg: tuple[str, str, str, str, list[tuple[int, str, Any]]],
) -> list[dict[str, Any]]:
    """``put_writes``' record items: the writes of ``arg`` (``(ns, checkpoint id, task id,
    task path, [(idx, channel, value)])``) the thread does not have yet, values encoded with
    ``encode`` (``ValueCodec.encode``). A function, not a closure per call: a closure and its
    cells are objects the garbage collector counts."""
    ns, cid, task_id, task_path, writes = arg
    present = idx.writes.get((ns, cid), {})
    return [
        {
            "k": "w",
            "ns": ns,
            "cid": cid,
            "task": task_id,
            "idx": i,
            "channel": channel,
            "value": encode(value, "write of task {!r} to {!r}", task_id, channel),
            "path": task_path,
        }
        for i, channel, value in writes
        if i < 0 or (task_id, i) not in present
    ]
