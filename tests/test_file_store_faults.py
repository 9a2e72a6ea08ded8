"""Appends that cannot be made durable, the durability/visibility rule and group commit."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from wakeful.clock import ManualClock
from wakeful.errors import StoreUnavailable
from wakeful.records import Commit, EventDraft, Message
from wakeful.store.file import FileStore, open_file_store
from wakeful.store.file.snapshot import decode_state, encode_state
from wakeful.store.memory import InjectedCrash
from wakeful.store.projection import State

pytestmark = pytest.mark.asyncio

LOG = "commits.ndjson"


class DiskFault:
    """Replaces ``os.<call>`` so that, once armed, it fails with ``err`` for the file at a
    given path (matched by device and inode), ``times`` times; other files are untouched.
    ``partial`` writes half the data before failing; ``gate`` blocks the failing call until
    set (``entered`` tells the test it is blocked)."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, call: str, err: int, *, partial: bool = False
    ) -> None:
        self.call, self.err, self.partial = call, err, partial
        self.real: Callable[..., Any] = getattr(os, call)
        self.target: tuple[int, int] | None = None
        self.left = 0
        self.fired = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        monkeypatch.setattr(os, call, self._fake)

    def arm(self, path: Path, times: int = 1, gate: threading.Event | None = None) -> None:
        st = os.stat(path)
        self.target, self.left, self.gate = (st.st_dev, st.st_ino), times, gate

    def _fake(self, fd: int, *args: Any) -> Any:
        if self.left > 0 and self.target is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == self.target:
                self.left -= 1
                self.fired += 1
                self.entered.set()
                if self.gate is not None:
                    assert self.gate.wait(30)
                if self.partial:
                    self.real(fd, args[0][: len(args[0]) // 2])
                raise OSError(self.err, os.strerror(self.err))
        return self.real(fd, *args)


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def copy_of(store: FileStore) -> State:
    return decode_state(encode_state(store._state))


async def opened(root: Path, clock: ManualClock) -> FileStore:
    return await open_file_store(root.as_uri(), clock=clock, compact_bytes=None)


@pytest.mark.parametrize(
    ("call", "err", "partial"),
    [
        ("write", errno.ENOSPC, False),
        ("write", errno.ENOSPC, True),
        ("write", errno.EIO, False),
        ("fsync", errno.ENOSPC, False),
        ("fsync", errno.EIO, False),
    ],
)
async def test_an_append_that_cannot_be_made_durable_leaves_no_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, err: int, partial: bool
) -> None:
    fault = DiskFault(monkeypatch, call, err, partial=partial)
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    claim = await store.claim("t1", "h", 60)
    await store.commit(
        "t1",
        Commit(
            token=claim.token,
            events=(EventDraft(type="a"),),
            messages=(Message(id="m-a", role="user"),),
        ),
    )
    acknowledged = copy_of(store)
    fault.arm(tmp_path / LOG)
    with pytest.raises(StoreUnavailable, match="could not append") as failed:
        await store.commit(
            "t1",
            Commit(
                token=claim.token,
                events=(EventDraft(type="b"),),
                messages=(Message(id="m-b", role="user"),),
            ),
        )
    assert fault.fired == 1
    assert os.strerror(err) in str(failed.value)
    if err == errno.ENOSPC:  # the cause named, and the action that helps
        assert "No space is left on the device: free space on that file system, then " in str(
            failed.value
        )
    else:
        assert "disk space or permissions" in str(failed.value)
    assert store._state == acknowledged, "the failed mutation is not visible"
    later = await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="c"),)))
    assert (later.version, later.events) == (2, (2,))
    await store.close()
    assert (tmp_path / LOG).read_bytes().endswith(b"\n")
    reopened = await opened(tmp_path, clock)
    assert [e.type for e in await reopened.events_after("t1")] == ["a", "c"]
    assert [m.id for m in await reopened.messages("t1")] == ["m-a"]
    await reopened.close()


async def test_every_caller_of_a_failed_batch_and_every_later_record_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = DiskFault(monkeypatch, "fsync", errno.EIO)
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    claims = [await store.claim(f"t{i}", "h", 60) for i in range(6)]
    acknowledged = copy_of(store)
    gate = threading.Event()
    fault.arm(tmp_path / LOG, gate=gate)

    def commit(i: int) -> asyncio.Task[Any]:
        c = Commit(token=claims[i].token, events=(EventDraft(type="e"),))
        return asyncio.create_task(store.commit(f"t{i}", c))

    first = [commit(i) for i in range(3)]
    await until(fault.entered.is_set)  # the batch of t0..t2 is in its (failing) fsync
    later = [commit(i) for i in range(3, 6)]
    # Applied but not durable: visible to a reader in this process (the documented window),
    # not acknowledged.
    await until(lambda: all(store._state.threads[f"t{i}"].version == 1 for i in range(6)))
    assert not any(task.done() for task in first + later)
    gate.set()
    results = await asyncio.gather(*first, *later, return_exceptions=True)
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    assert fault.fired == 1
    assert store._state == acknowledged
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert reopened._state == acknowledged
    for i in range(6):
        receipt = await reopened.commit(
            f"t{i}", Commit(token=claims[i].token, events=(EventDraft(type="ok"),))
        )
        assert receipt.events == (1,)
    await reopened.close()


async def test_the_store_refuses_service_until_it_could_rebuild_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsync = DiskFault(monkeypatch, "fsync", errno.EIO)
    truncate = DiskFault(monkeypatch, "ftruncate", errno.EIO)
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    claim = await store.claim("t1", "h", 60)
    acknowledged = copy_of(store)
    fsync.arm(tmp_path / LOG)
    truncate.arm(tmp_path / LOG, times=2)  # cutting the failed append back fails too, twice
    with pytest.raises(StoreUnavailable, match="could not append"):
        await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="x"),)))
    # The projection still holds the failed mutation, so nothing may be read from it.
    with pytest.raises(StoreUnavailable):
        await store.read("t1")
    await until(lambda: truncate.fired == 2)  # that read started a second, failing, rebuild

    async def readable() -> bool:
        try:
            await store.read("t1")
        except StoreUnavailable:
            return False
        return True

    deadline = asyncio.get_running_loop().time() + 10
    while not await readable():  # each refused call retries the rebuild
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.001)
    assert store._state == acknowledged
    receipt = await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="y"),)))
    assert receipt.events == (1,)
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert [e.type for e in await reopened.events_after("t1")] == ["y"]
    await reopened.close()


async def test_acknowledgement_and_notification_wait_for_the_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    gate, entered = threading.Event(), threading.Event()
    log_inode = 0

    def slow_fsync(fd: int) -> None:
        if os.fstat(fd).st_ino == log_inode and not gate.is_set():
            entered.set()
            assert gate.wait(30)
        real_fsync(fd)

    clock = ManualClock()
    store = await opened(tmp_path, clock)
    claim = await store.claim("t1", "h", 60)
    log_inode = os.stat(tmp_path / LOG).st_ino
    monkeypatch.setattr(os, "fsync", slow_fsync)
    waiter = asyncio.create_task(store.wait_events("t1", 0, timeout=60))
    await until(lambda: "t1" in store._waiters)
    committing = asyncio.create_task(
        store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="b"),)))
    )
    await until(entered.is_set)
    assert [e.type for e in await store.events_after("t1")] == ["b"], "visible in-process"
    assert not committing.done(), "not acknowledged before the fsync"
    assert not waiter.done(), "no waiter is woken before the fsync"
    gate.set()
    receipt = await asyncio.wait_for(committing, 10)
    events = await asyncio.wait_for(waiter, 10)
    assert receipt.events == (1,) and [e.seq for e in events] == [1]
    await store.close()


async def test_concurrent_writers_share_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    claims = [await store.claim(f"t{i}", "h", 60) for i in range(16)]
    log_inode = os.stat(tmp_path / LOG).st_ino
    real_fsync, fsyncs = os.fsync, []

    def counting_fsync(fd: int) -> None:
        if os.fstat(fd).st_ino == log_inode:
            fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    before = store.stats
    receipts = await asyncio.gather(
        *(
            store.commit(f"t{i}", Commit(token=c.token, events=(EventDraft(type="e"),)))
            for i, c in enumerate(claims)
        )
    )
    assert [r.version for r in receipts] == [1] * 16
    assert len(fsyncs) == 1
    after = store.stats
    assert (after.appends - before.appends, after.records - before.records) == (1, 16)
    for c in claims[:4]:  # one after the other: one fsync each
        await store.release(c.thread_id, c.token)
    assert len(fsyncs) == 5
    await store.close()
    reopened = await opened(tmp_path, clock)
    assert [s.version for s in await reopened.list_threads()] == [1] * 16
    await reopened.close()


@pytest.mark.parametrize("point", ["log.after_write", "log.after_fsync"])
async def test_a_crash_inside_an_append_never_leaves_a_partial_record(
    tmp_path: Path, point: str
) -> None:
    clock = ManualClock()
    store = await opened(tmp_path, clock)
    claim = await store.claim("t1", "h", 60)
    acknowledged = copy_of(store)
    store.crash_at(point)
    with pytest.raises(InjectedCrash, match=point):
        await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="x"),)))
    with pytest.raises(StoreUnavailable, match="injected crash"):
        await store.read("t1")
    await store.close()
    assert (tmp_path / LOG).read_bytes().endswith(b"\n")
    reopened = await opened(tmp_path, clock)
    # Never acknowledged, so either outcome is allowed; here the bytes reached the page cache.
    snap = await reopened.read("t1")
    assert snap is not None and snap.version == 1
    assert reopened._state != acknowledged
    await reopened.close()
