"""Compaction: snapshot plus fresh log, switched atomically; crashes and IO errors at every
step."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.file_child import mixed_workload
from wakeful.clock import ManualClock
from wakeful.errors import StoreUnavailable
from wakeful.records import Checkpoint, Commit, EventDraft, Message
from wakeful.store.file import COMPACTION_STEPS, FileStore, open_file_store
from wakeful.store.file.fsutil import fsync_dir, write_synced
from wakeful.store.file.snapshot import decode_state, encode_state
from wakeful.store.memory import InjectedCrash
from wakeful.store.projection import State

pytestmark = pytest.mark.asyncio

LOG, SNAPSHOT = "commits.ndjson", "snapshot.json"


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def temp_files(root: Path) -> list[Path]:
    return list(root.glob("*.tmp"))


def copy_of(store: FileStore) -> State:
    return decode_state(encode_state(store._state))


def generations(root: Path) -> tuple[int | None, int]:
    """(snapshot generation or None, log generation) as written in the files' headers."""
    snap = None
    if (root / SNAPSHOT).exists():
        snap = json.loads((root / SNAPSHOT).read_bytes().split(b"\n")[0])["m"]["generation"]
    log = json.loads((root / LOG).read_bytes().split(b"\n")[0])["m"]["generation"]
    return snap, log


async def opened(root: Path, clock: ManualClock, **options: Any) -> FileStore:
    options.setdefault("compact_bytes", None)
    return await open_file_store(root.as_uri(), clock=clock, **options)


async def test_compact_replaces_the_log_by_a_snapshot(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    await mixed_workload(store, clock, rounds=2, tag="a")
    size_before = store.stats.log_size
    await store.compact()
    assert generations(tmp_path) == (1, 1)
    assert store.stats.log_size < 100 < size_before and store.stats.compactions == 1
    await mixed_workload(store, clock, rounds=1, tag="b")
    expected = copy_of(store)
    await store.close()
    assert not temp_files(tmp_path)
    reopened = await opened(tmp_path, clock)
    assert reopened._state == expected
    events = await reopened.events_after("ta-a1", 1)  # numbering survives the snapshot
    assert [e.seq for e in events] == [2, 3]
    await reopened.close()


async def test_automatic_compaction_under_concurrent_writers_keeps_everything(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    store = await opened(tmp_path, clock, compact_bytes=20_000)

    async def writer(k: int) -> None:
        thread = f"w{k}"
        claim = await store.claim(thread, "h", 60)
        parent = None
        for n in range(60):
            cp = Checkpoint(
                id=f"{thread}-{n}",
                parent=parent,
                run_id="r",
                status="running",
                state={"n": n, "pad": "x" * 200},
                created_at=clock.now(),
            )
            await store.commit(
                thread, Commit(token=claim.token, checkpoint=cp, events=(EventDraft(type="s"),))
            )
            parent = cp.id

    await asyncio.gather(*(writer(k) for k in range(8)))
    assert store.stats.compactions >= 2
    assert store.stats.appends < 480, "group commit batched the writers"
    expected = copy_of(store)
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert reopened._state == expected
    for k in range(8):
        snap = await reopened.read(f"w{k}")
        assert snap is not None and snap.version == 60 and snap.last_seq == 60
    await reopened.close()


@pytest.mark.parametrize("step", COMPACTION_STEPS)
async def test_a_crash_at_any_compaction_step_reopens_to_the_acknowledged_state(
    tmp_path: Path, step: str
) -> None:
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    await mixed_workload(store, clock, rounds=1, tag="a")
    await store.compact()  # so an older snapshot/log pair exists too
    await mixed_workload(store, clock, rounds=1, tag="b")
    acknowledged = copy_of(store)
    store.crash_at(step)
    with pytest.raises(InjectedCrash, match=step):
        await store.compact()
    with pytest.raises(StoreUnavailable, match="injected crash"):
        await store.read("ta-b0")
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert reopened._state == acknowledged
    assert generations(tmp_path) in ((1, 1), (2, 2))
    assert not temp_files(tmp_path)
    await mixed_workload(reopened, clock, rounds=1, tag="c")
    expected = copy_of(reopened)
    await reopened.close()
    again = await opened(tmp_path, clock)
    assert again._state == expected
    await again.close()


async def test_a_crash_mid_compaction_loses_only_unacknowledged_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, entered = threading.Event(), threading.Event()

    def held_write(path: Path, data: bytes, *args: Any) -> None:
        entered.set()
        assert gate.wait(30)
        write_synced(path, data, *args)

    monkeypatch.setattr("wakeful.store.file.root.write_synced", held_write)
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    claim = await store.claim("t1", "h", 60)
    acknowledged = copy_of(store)
    store.crash_at("compact.snapshot_renamed")
    compacting = asyncio.create_task(store.compact())
    await until(entered.is_set)  # the snapshot is taken; its files are being written
    committing = asyncio.create_task(
        store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="x"),)))
    )
    await until(lambda: store._state.threads["t1"].version == 1)  # applied, waiting
    gate.set()
    results = await asyncio.gather(compacting, committing, return_exceptions=True)
    assert all(isinstance(r, InjectedCrash) for r in results), results
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert reopened._state == acknowledged
    await reopened.close()


async def test_an_interrupted_compaction_is_finished_on_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    await mixed_workload(store, clock, rounds=1)
    acknowledged = copy_of(store)
    store.crash_at("compact.snapshot_dir_synced")
    with pytest.raises(InjectedCrash):
        await store.compact()
    await store.close()
    assert generations(tmp_path) == (1, 0), "snapshot installed, its log not"
    with caplog.at_level(logging.WARNING, logger="wakeful.store.file"):
        reopened = await opened(tmp_path, clock)
    assert any("interrupted compaction" in r.getMessage() for r in caplog.records)
    assert generations(tmp_path) == (1, 1)
    assert reopened._state == acknowledged
    await reopened.close()


async def test_a_compaction_that_fails_before_its_commit_point_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def failing_write(path: Path, data: bytes, *args: Any) -> None:
        calls.append(path)
        if len(calls) == 2:  # the log's temp file, after the snapshot's
            raise OSError(errno.ENOSPC, "No space left on device")
        write_synced(path, data, *args)

    monkeypatch.setattr("wakeful.store.file.root.write_synced", failing_write)
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    await mixed_workload(store, clock, rounds=1, tag="a")
    log_before = (tmp_path / LOG).read_bytes()
    with pytest.raises(StoreUnavailable, match="compaction") as failed:
        await store.compact()
    assert "no space is left on the device: free space" in str(failed.value)
    assert (tmp_path / LOG).read_bytes() == log_before
    assert not (tmp_path / SNAPSHOT).exists() and not temp_files(tmp_path)
    await mixed_workload(store, clock, rounds=1, tag="b")  # the old log keeps working
    expected = copy_of(store)
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert reopened._state == expected
    await reopened.close()


async def test_a_compaction_that_fails_after_its_commit_point_recovers_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = [OSError(errno.EIO, "Input/output error")]

    def failing_fsync_dir(path: Path) -> None:
        if failures:
            raise failures.pop()
        fsync_dir(path)

    clock = ManualClock()
    store = await opened(tmp_path, clock)
    await mixed_workload(store, clock, rounds=1, tag="a")
    acknowledged = copy_of(store)
    monkeypatch.setattr("wakeful.store.file.root.fsync_dir", failing_fsync_dir)
    with pytest.raises(StoreUnavailable, match="compaction"):
        await store.compact()
    # The snapshot was renamed in: the store rebuilt from disk, finishing the switch.
    assert store._state == acknowledged
    assert generations(tmp_path) == (1, 1)
    await mixed_workload(store, clock, rounds=1, tag="b")
    expected = copy_of(store)
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert reopened._state == expected
    await reopened.close()


async def test_an_unexpected_flusher_failure_leaves_nobody_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_encoder(state: State) -> bytes:
        raise RuntimeError("bug")

    clock = ManualClock()
    store = await opened(tmp_path, clock)
    await mixed_workload(store, clock, rounds=1)
    acknowledged = copy_of(store)
    monkeypatch.setattr("wakeful.store.file.store.encode_state", broken_encoder)
    with pytest.raises(StoreUnavailable, match="bug"):
        await store.compact()
    monkeypatch.undo()
    assert store._state == acknowledged
    claim = await store.claim("after", "h", 30)  # a new flusher takes over
    assert claim.token == 1
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert (await reopened.read("after")) is not None
    await reopened.close()


async def test_a_snapshot_keeps_branches_and_the_history_order(tmp_path: Path) -> None:
    """A thread's branches (time travel, decision 0036) and its checkpoints' commit order
    live in the projection only: the snapshot must carry them, or a compacted store would
    show the abandoned line's messages as the head's."""
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    claim = await store.claim("t", "h", 30)
    line: list[Checkpoint] = []
    for i in range(3):
        cp = Checkpoint(
            id=f"c{i}",
            parent=line[-1].id if line else None,
            run_id="r",
            status="running",
            state={"i": i},
            created_at=clock.now(),
        )
        message = Message(id=f"m{i}", role="user", content=f"m{i}")
        await store.commit("t", Commit(token=claim.token, checkpoint=cp, messages=(message,)))
        line.append(cp)
    fork = Checkpoint(
        id="b0", parent="c0", run_id="r2", status="running", state={}, created_at=clock.now()
    )
    await store.commit(
        "t",
        Commit(
            token=claim.token,
            checkpoint=fork,
            branch_from="c0",
            branch_messages=1,
            messages=(Message(id="n0", role="user", content="n0"),),
        ),
    )
    await store.compact()
    expected = copy_of(store)
    await store.close()
    reopened = await opened(tmp_path, clock)
    try:
        assert reopened._state == expected
        assert [m.id for m in await reopened.messages("t", 0, 10)] == ["m0", "n0"]
        assert [m.id for m in await reopened.branch_messages("t", 0, 0, 10)] == ["m0", "m1", "m2"]
        entries = await reopened.history("t", before="b0")
        assert [(e.checkpoint.id, e.branch) for e in entries] == [("c2", 0), ("c1", 0), ("c0", 0)]
        snap = await reopened.read("t")
        assert snap is not None and snap.branch == 1 and snap.message_count == 2
    finally:
        await reopened.close()
