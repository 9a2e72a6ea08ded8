"""Real processes: SIGKILL at random moments, and the lock between processes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from wakeful.errors import StoreLocked
from wakeful.store.file import open_file_store

CHILD = Path(__file__).with_name("file_child.py")
LOG = "commits.ndjson"


def child(err: Path, *args: str) -> subprocess.Popen[bytes]:
    with err.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=sink,
        )


def read_lines(proc: subprocess.Popen[bytes], lines: list[str], first: threading.Event) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        if raw.endswith(b"\n"):
            lines.append(raw.decode().strip())
            first.set()


async def verify(root: Path, acked: dict[str, int], seed: int) -> None:
    """Every acknowledged commit is there, whole; the log ends with a complete record."""
    store = await open_file_store(root.as_uri())
    try:
        assert (root / LOG).read_bytes().endswith(b"\n"), seed
        assert not [name for name in os.listdir(root) if name.endswith(".tmp")], seed
        for thread, version in acked.items():
            snap = await store.read(thread)
            assert snap is not None and snap.version >= version, (seed, thread, version)
            # the thread is internally whole: one checkpoint, event and message per commit
            assert snap.checkpoint is not None, seed
            assert snap.checkpoint.id == f"{thread}-cp-{snap.version}", (seed, thread)
            assert snap.last_seq == snap.message_count == snap.version, (seed, thread)
    finally:
        await store.close()


@pytest.mark.slow
def test_acknowledged_commits_survive_sigkill_at_random_moments(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    root = tmp_path / "root"
    acked: dict[str, int] = {}
    compactions_seen = 0
    for round_ in range(20):
        lines: list[str] = []
        first = threading.Event()
        with child(tmp_path / "child.err", "commit", str(root), f"r{round_}") as proc:
            reader = threading.Thread(target=read_lines, args=(proc, lines, first))
            reader.start()
            if not first.wait(30):
                proc.kill()
                reader.join(30)
                errors = (tmp_path / "child.err").read_text()[-2000:]
                pytest.fail(f"the child never acknowledged a commit: {errors}")
            time.sleep(rng.uniform(0.0, 0.15))  # the random moment; correctness never waits on it
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            reader.join(30)
        assert proc.returncode == -signal.SIGKILL, (seed, proc.returncode)
        assert lines, seed
        for line in lines:
            word, thread, version, checkpoint = line.split()
            assert word == "ack" and checkpoint == f"{thread}-cp-{version}", (seed, line)
            acked[thread] = max(acked.get(thread, 0), int(version))
        asyncio.run(verify(root, acked, seed))
        compactions_seen += (root / "snapshot.json").exists()
    assert {thread.split("-")[0] for thread in acked} == {f"r{n}" for n in range(20)}
    assert compactions_seen > 0, "the child compacts every 50 kB: kills hit compacted roots"


@pytest.mark.asyncio
async def test_a_second_process_opening_the_root_gets_store_locked(tmp_path: Path) -> None:
    store = await open_file_store(tmp_path.as_uri())
    try:
        run = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), "try-open", str(tmp_path), stdout=subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(run.communicate(), 30)
        assert out.decode().split() == ["locked"]
    finally:
        await store.close()
    run = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), "try-open", str(tmp_path), stdout=subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(run.communicate(), 30)
    assert out.decode().split() == ["opened"]


@pytest.mark.asyncio
async def test_a_root_held_by_another_process_is_refused_here(tmp_path: Path) -> None:
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        "hold",
        str(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"ready"
    with pytest.raises(StoreLocked) as refused:
        await open_file_store(tmp_path.as_uri())
    assert refused.value.root == str(tmp_path)
    holder.stdin.close()
    assert await asyncio.wait_for(holder.wait(), 30) == 0
    store = await open_file_store(tmp_path.as_uri())
    await store.close()


@pytest.mark.asyncio
async def test_a_second_open_in_the_same_process_gets_store_locked(tmp_path: Path) -> None:
    first = await open_file_store(tmp_path.as_uri())
    claim = await first.claim("t1", "h", 30)
    alias = tmp_path.parent / f"{tmp_path.name}-alias"
    alias.symlink_to(tmp_path)
    for spelling in (tmp_path, alias, tmp_path / "." / "stream-checkpoints" / ".."):
        with pytest.raises(StoreLocked):
            await open_file_store(spelling.as_uri())
    await first.release("t1", claim.token)  # the refused openers disturbed nothing
    await first.close()
    second = await open_file_store(alias.as_uri())
    snap = await second.read("t1")
    assert snap is not None and snap.claim is None
    await second.close()


def try_open(root: Path) -> str:
    run = subprocess.run(
        [sys.executable, str(CHILD), "try-open", str(root)],
        stdout=subprocess.PIPE,
        timeout=30,
        check=True,
    )
    return run.stdout.decode().strip()


def test_a_deleted_lock_file_lets_no_second_process_in_and_loses_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    lines: list[str] = []
    first = threading.Event()
    with (tmp_path / "a.err").open("ab") as sink:
        writer = subprocess.Popen(
            [sys.executable, str(CHILD), "commit-hold", str(root), "a"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sink,
        )
    with writer:
        reader = threading.Thread(target=read_lines, args=(writer, lines, first))
        reader.start()
        try:
            assert first.wait(30), (tmp_path / "a.err").read_text()
            (root / "wakeful.lock").unlink()  # the operator error of issue 35
            assert try_open(root) == "locked"
            # The holder notices before its next append, refuses it and stops acknowledging.
            deadline = time.monotonic() + 30
            while not any(line.startswith("refused") for line in lines):
                assert time.monotonic() < deadline and writer.poll() is None, lines[-3:]
                time.sleep(0.01)
            assert try_open(root) == "locked"  # still held while the holder lives
            assert writer.stdin is not None
            writer.stdin.close()
            assert writer.wait(30) == 0
        finally:
            writer.kill()
            reader.join(30)
    refused = [line for line in lines if line.startswith("refused")]
    assert len(refused) == 1 and "was removed while this store held it" in refused[0]
    acked: dict[str, int] = {}
    for line in lines[: lines.index(refused[0])]:
        _, thread, version, _ = line.split()
        acked[thread] = max(acked.get(thread, 0), int(version))
    assert acked
    asyncio.run(verify(root, acked, 0))
