"""Opening by URL, options, the root's files and stream checkpoints on disk."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from wakeful.clock import ManualClock
from wakeful.errors import StoreUnavailable, StreamCheckpointError, UnsupportedStore
from wakeful.records import Commit, EventDraft, StreamCheckpoint
from wakeful.store import open_store
from wakeful.store.file import FileStore, open_file_store, parse_file_url
from wakeful.store.file.stream import file_name

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("file://relative/dir", "host name"),
        ("file:relative/dir", "must be absolute"),
        ("file://", "must be absolute"),
        ("file:///abs/dir?compact_bytes=1", "no query"),
        ("file://otherhost/abs/dir", "host name"),
    ],
)
async def test_only_absolute_local_file_urls_are_accepted(url: str, problem: str) -> None:
    with pytest.raises(UnsupportedStore, match=problem):
        await open_store(url)


async def test_file_urls_are_percent_decoded() -> None:
    assert parse_file_url("file:///var/lib/my%20store") == Path("/var/lib/my store")
    assert parse_file_url("file://localhost/srv/x") == Path("/srv/x")


async def test_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedStore, match="unknown options"):
        await open_store(tmp_path.as_uri(), fsync=False)
    for bad in (0, -1, 1.5, True, "big"):
        with pytest.raises(UnsupportedStore, match="compact_bytes"):
            await open_store(tmp_path.as_uri(), compact_bytes=bad)


async def test_open_store_creates_the_root_and_its_files(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "store"
    clock = ManualClock()
    async with open_store(root.as_uri(), clock=clock) as store:
        assert isinstance(store, FileStore) and store.root == root
        claim = await store.claim("t1", "h", 30)
        await store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="e"),)))
    assert sorted(p.name for p in root.iterdir()) == [
        "commits.ndjson",
        "stream-checkpoints",
        "wakeful.lock",
    ]
    header = json.loads((root / "commits.ndjson").read_bytes().split(b"\n")[0])
    assert header["m"] == {"format": "wakeful.file-log", "version": 2, "generation": 0}
    async with open_store(root.as_uri(), clock=clock) as again:
        assert [e.type for e in await again.events_after("t1")] == ["e"]


async def test_a_root_that_cannot_be_created_is_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="correct the absolute path"):
        await open_store((tmp_path / "file" / "store").as_uri())


async def test_a_closed_store_refuses_and_releases_its_root(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri())
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StreamCheckpointError, match="closed"):
        await store.stream_checkpoints.get("run-1")
    second = await open_file_store(tmp_path.as_uri())
    await second.close()


def checkpoint(run_id: str, thread_id: str, token: int, text: str = "") -> StreamCheckpoint:
    return StreamCheckpoint(
        run_id=run_id, thread_id=thread_id, model="m", partial_text=text, token=token
    )


async def test_stream_checkpoint_files_are_named_by_a_hash_of_the_run_id(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri())
    claim = await store.claim("t1", "h", 30)
    run_id = "run:a..x"  # a legal id with dots and a colon: never a path component
    await store.stream_checkpoints.put(checkpoint(run_id, "t1", claim.token, "hi"))
    [stored] = list((tmp_path / "stream-checkpoints").iterdir())
    assert stored.name == file_name(run_id) and run_id not in stored.name
    content = json.loads(stored.read_bytes())
    assert content["format"] == "wakeful.stream-checkpoint" and content["version"] == 1
    assert content["checkpoint"]["run_id"] == run_id
    for bad in ("../../etc/passwd", "/abs", "", ".hidden", "a" * 201):
        with pytest.raises(StreamCheckpointError) as refused:
            await store.stream_checkpoints.get(bad)
        assert refused.value.reason == "invalid"
    await store.close()


async def test_delete_thread_removes_that_threads_stream_checkpoints(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri())
    one, two = await store.claim("t1", "h", 30), await store.claim("t2", "h", 30)
    await store.commit("t1", Commit(token=one.token, events=(EventDraft(type="e"),)))
    for run in ("run-a", "run-b"):
        await store.stream_checkpoints.put(checkpoint(run, "t1", one.token))
    await store.stream_checkpoints.put(checkpoint("run-c", "t2", two.token))
    await store.delete_thread("t1")
    assert await store.stream_checkpoints.get("run-a") is None
    assert await store.stream_checkpoints.get("run-b") is None
    assert await store.stream_checkpoints.get("run-c") is not None
    assert len(list((tmp_path / "stream-checkpoints").iterdir())) == 1
    with pytest.raises(StreamCheckpointError) as refused:  # the deleted thread's token
        await store.stream_checkpoints.put(checkpoint("run-a", "t1", one.token))
    assert refused.value.reason == "stale"
    await store.close()


async def test_stream_checkpoint_storage_failures_are_typed(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri())
    claim = await store.claim("t1", "h", 30)
    await store.stream_checkpoints.put(checkpoint("run-1", "t1", claim.token, "kept"))
    directory = tmp_path / "stream-checkpoints"
    (directory / file_name("run-1")).write_bytes(b"{not json")
    with pytest.raises(StreamCheckpointError) as corrupt:
        await store.stream_checkpoints.get("run-1")
    assert corrupt.value.reason == "storage"
    shutil.rmtree(directory)
    directory.write_text("a file where the directory was")
    with pytest.raises(StreamCheckpointError) as failed:
        await store.stream_checkpoints.put(checkpoint("run-2", "t1", claim.token))
    assert failed.value.reason == "storage" and "cannot write" in str(failed.value)
    with pytest.raises(StreamCheckpointError) as failed:
        await store.stream_checkpoints.delete("run-2")
    assert failed.value.reason == "storage"
    await store.close()


async def test_opening_removes_temp_files_a_crash_left_behind(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri())
    await store.close()
    strays = [
        tmp_path / "snapshot.json.tmp",
        tmp_path / "commits.ndjson.tmp",
        tmp_path / "stream-checkpoints" / f".{file_name('run-1')}.0123.tmp",
    ]
    for stray in strays:
        stray.write_bytes(b"partial")
    store = await open_file_store(tmp_path.as_uri())
    assert not any(stray.exists() for stray in strays)
    await store.close()
    assert os.listdir(tmp_path / "stream-checkpoints") == []


@pytest.mark.asyncio
async def test_the_io_threads_then_runs_with_the_result_before_the_awaiting_task_resumes() -> None:
    """``IOThread.run(fn, then)``: ``then`` gets a successful result on the loop before the
    awaiting task resumes (the file store answers a batch's callers there); a failed ``fn``
    skips it and raises in the awaiting task."""
    from wakeful.store.file.iothread import IOThread

    io = IOThread("test-io")
    order: list[object] = []
    try:
        result = await io.run(lambda: 5, lambda value: order.append(("then", value)))
        order.append(("resumed", result))
        assert order == [("then", 5), ("resumed", 5)]

        def fail() -> int:
            raise OSError("disk")

        with pytest.raises(OSError, match="disk"):
            await io.run(fail, lambda value: order.append(("then", value)))
        assert order == [("then", 5), ("resumed", 5)]
    finally:
        io.stop()


@pytest.mark.asyncio
async def test_sequential_commits_are_counted_one_append_each(tmp_path: Path) -> None:
    """The counters move in the callback that answers a batch: after each awaited commit
    they already include it."""
    store = await open_file_store(tmp_path.as_uri())
    try:
        claim = await store.claim("t", "h", 60)
        before = store.stats
        for i in range(3):
            await store.commit("t", Commit(token=claim.token, events=(EventDraft(type=f"e{i}"),)))
            after = store.stats
            assert (after.appends - before.appends, after.records - before.records) == (
                i + 1,
                i + 1,
            )
        assert after.bytes > before.bytes
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_closed_stores_leave_no_descriptors_open(tmp_path: Path) -> None:
    """The IO thread's wake-up pipe is closed when the thread takes its stop marker: opening
    and closing a store many times does not grow the process's descriptors."""
    import asyncio
    import threading

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def cycle(i: int) -> None:
        store = await open_file_store((tmp_path / f"s{i}").as_uri())
        claim = await store.claim("t", "h", 60)
        await store.commit("t", Commit(token=claim.token, events=(EventDraft(type="e"),)))
        await store.close()

    await cycle(0)
    baseline = open_fds()
    for i in range(1, 21):
        await cycle(i)
    # close() does not wait for the IO threads: wait for them to exit (they close the pipe)
    for thread in threading.enumerate():
        if thread.name.startswith("wakeful-file-store:"):
            await asyncio.to_thread(thread.join, 10)
    assert open_fds() <= baseline
