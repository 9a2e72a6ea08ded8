"""A full disk or an exhausted quota is named as such, with the action that helps (free
space), wherever a store write can hit it (issue 35 item 8)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.sqlite_support import sqlite_url
from wakeful.errors import StoreUnavailable, StreamCheckpointError
from wakeful.records import Checkpoint, Commit, EventDraft, StreamCheckpoint
from wakeful.store import open_store
from wakeful.store.file import open_file_store

pytestmark = pytest.mark.asyncio

ADVICE = {
    errno.ENOSPC: "no space is left on the device: free space on that file system",
    errno.EDQUOT: "the disk quota of the store's user is exhausted: free space",
}


class FullDisk:
    """``os.write`` fails with ``err`` for files whose path contains ``part``, once armed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
        self.err = err
        self.part: str | None = None
        self.fired = 0
        self.real: Callable[..., Any] = os.write
        monkeypatch.setattr(os, "write", self._write)

    def _write(self, fd: int, data: Any) -> int:
        if self.part is not None and self.part in os.readlink(f"/proc/self/fd/{fd}"):
            self.fired += 1
            raise OSError(self.err, os.strerror(self.err))
        result: int = self.real(fd, data)
        return result


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
async def test_opening_a_log_with_a_torn_tail_on_a_full_disk_says_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    store = await open_file_store(tmp_path.as_uri(), compact_bytes=None)
    claim = await store.claim("t1", "h", 60)
    await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="a"),)))
    await store.close()
    with (tmp_path / "commits.ndjson").open("ab") as log:
        log.write(b"\0\0\0\0")  # a torn append: the opener keeps it aside before cutting it
    disk = FullDisk(monkeypatch, err)
    disk.part = ".torn-"
    with pytest.raises(StoreUnavailable) as refused:
        await open_file_store(tmp_path.as_uri())
    assert disk.fired == 1
    message = str(refused.value)
    assert os.strerror(err) in message
    assert f"{ADVICE[err]}" in message and message.endswith("then reopen; retry later")
    assert "ownership" not in message


async def test_any_other_open_failure_still_points_at_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreUnavailable, match="correct the absolute path, its ownership"):
        await open_file_store((blocker / "root").as_uri())


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
async def test_a_stream_checkpoint_on_a_full_disk_says_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    store = await open_file_store(tmp_path.as_uri(), compact_bytes=None)
    claim = await store.claim("t1", "h", 60)
    disk = FullDisk(monkeypatch, err)
    disk.part = "stream-checkpoints"
    checkpoint = StreamCheckpoint(
        run_id="run-1", thread_id="t1", model="m", partial_text="hi", token=claim.token
    )
    with pytest.raises(StreamCheckpointError) as refused:
        await store.stream_checkpoints.put(checkpoint)
    assert disk.fired == 1 and ADVICE[err] in str(refused.value)
    disk.part = None
    await store.close()


async def test_a_full_sqlite_database_says_free_space(tmp_path: Path) -> None:
    store = await open_store(sqlite_url(tmp_path / "db.sqlite"))
    try:
        claim = await store.claim("t1", "h", 60)
        db = store._db  # type: ignore[attr-defined]
        # SQLite's own limit on the file's size gives a real SQLITE_FULL from the real write
        # path, as a full file system does (its unix VFS reports ENOSPC as SQLITE_FULL).
        await db.write(lambda c: c.execute("PRAGMA max_page_count = 1"))
        checkpoint = Checkpoint(
            id="cp-1",
            parent=None,
            run_id="r",
            status="running",
            state={"pad": "x" * 200_000},
            created_at=datetime.now(UTC),
        )
        with pytest.raises(StoreUnavailable) as refused:
            await store.commit("t1", Commit(token=claim.token, checkpoint=checkpoint))
        message = str(refused.value)
        assert "(SQLITE_FULL)" in message and ADVICE[errno.ENOSPC] in message
        snap = await store.read("t1")
        assert snap is not None and snap.checkpoint is None  # the refused commit left nothing
    finally:
        await store.close()
