"""The holder of a root whose lock file is removed or replaced stops writing (issue 35)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from wakeful.errors import StoreUnavailable
from wakeful.records import Commit, EventDraft
from wakeful.store.file import FileStore, open_file_store

pytestmark = pytest.mark.asyncio


async def two_commits_around(store: FileStore, tamper: Callable[[], None]) -> None:
    claim = await store.claim("t1", "h", 60)
    await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="kept"),)))
    tamper()
    with pytest.raises(StoreUnavailable, match="close this store and open the root again"):
        await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="lost"),)))
    with pytest.raises(StoreUnavailable, match="while this store held it"):
        await store.read("t1")  # every later operation is refused too
    await store.close()


async def test_a_removed_lock_file_stops_the_holder_before_it_writes(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri(), compact_bytes=None)
    log_size = 0

    def tamper() -> None:
        nonlocal log_size
        (tmp_path / "wakeful.lock").unlink()
        log_size = (tmp_path / "commits.ndjson").stat().st_size

    await two_commits_around(store, tamper)
    assert (tmp_path / "commits.ndjson").stat().st_size == log_size, "nothing was appended"
    reopened = await open_file_store(tmp_path.as_uri())
    assert [e.type for e in await reopened.events_after("t1")] == ["kept"]
    await reopened.close()


async def test_a_replaced_lock_file_stops_the_holder(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri(), compact_bytes=None)

    def tamper() -> None:
        os.replace(tmp_path / "wakeful.lock", tmp_path / "old.lock")
        (tmp_path / "wakeful.lock").write_text("someone else\n")

    await two_commits_around(store, tamper)


async def test_a_root_moved_away_and_replaced_stops_the_holder(tmp_path: Path) -> None:
    root, moved = tmp_path / "root", tmp_path / "moved"
    store = await open_file_store(root.as_uri(), compact_bytes=None)

    def tamper() -> None:
        root.rename(moved)
        root.mkdir()
        (root / "wakeful.lock").write_text("")

    await two_commits_around(store, tamper)
    reopened = await open_file_store(moved.as_uri())
    assert [e.type for e in await reopened.events_after("t1")] == ["kept"]
    await reopened.close()


async def test_compaction_checks_the_lock_too(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri(), compact_bytes=None)
    claim = await store.claim("t1", "h", 60)
    await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="kept"),)))
    (tmp_path / "wakeful.lock").unlink()
    with pytest.raises(StoreUnavailable, match="was removed while this store held it"):
        await store.compact()
    await store.close()
    assert not (tmp_path / "snapshot.json").exists()


async def test_where_a_directory_cannot_be_locked_the_lock_file_alone_guards_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_flock = fcntl.flock

    def flock(fd: int, operation: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):  # as NFS answers for a read-only descriptor
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    # other tests quiet this logger for good (torn-tail warnings): hear it here
    caplog.set_level(logging.WARNING, logger="wakeful.store.file")
    store = await open_file_store(tmp_path.as_uri(), compact_bytes=None)
    assert any("cannot lock the directory itself" in r.getMessage() for r in caplog.records)

    def tamper() -> None:
        (tmp_path / "wakeful.lock").unlink()

    await two_commits_around(store, tamper)
