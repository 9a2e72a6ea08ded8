"""Workers as real processes over SQLite: SIGKILL mid-run, SIGSTOP past the lease, a
dispatch that kills its worker every time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.runtime_support import store_url
from wakeful import open_store
from wakeful.fleet import submit

ROOT = Path(__file__).resolve().parent.parent
TTL = 1.0
pytestmark = pytest.mark.slow


def spawn(url: str, worker_id: str, directory: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fleet_child", url, worker_id, str(directory), str(TTL)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(check: Callable[[], bool], what: str, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def stop(child: subprocess.Popen[str]) -> dict[str, int]:
    """SIGTERM, wait, and return the stats the worker printed."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


def kill(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
    child.communicate(timeout=30)


def crashes(directory: Path, count: int) -> Callable[[], bool]:
    return lambda: effects(directory).count("crash") == count


def effects(directory: Path) -> list[str]:
    path = directory / "effects.txt"
    return path.read_text().split() if path.exists() else []


async def thread_status(url: str, thread_id: str) -> tuple[str | None, list[str], str | None]:
    async with open_store(url) as store:
        snap = await store.read(thread_id)
        events = [e.type for e in await store.events_after(thread_id, 0, 1000)]
        d = await store.get_dispatch("d1")
        status = snap.checkpoint.status if snap and snap.checkpoint else None
        return status, events, d.status if d else None


@pytest.mark.asyncio
async def test_a_worker_killed_mid_run_is_replaced_without_rerunning_finished_tasks(
    tmp_path: Path,
) -> None:
    url = store_url("sqlite", tmp_path)
    async with open_store(url) as store:
        await submit(store, "t1", "steps", {}, dispatch_id="d1")
    first = spawn(url, "w1", tmp_path)
    try:
        await asyncio.to_thread(wait_for, (tmp_path / "b.started").exists, "b to start")
    finally:
        await asyncio.to_thread(kill, first)
    (tmp_path / "release-b").write_text("go")
    second = spawn(url, "w2", tmp_path)
    try:

        def completed() -> bool:
            return asyncio.run(thread_status(url, "t1"))[0] == "completed"

        await asyncio.to_thread(wait_for, completed, "the run to complete elsewhere")
    finally:
        stats = await asyncio.to_thread(stop, second)
    assert effects(tmp_path) == ["a", "b", "b", "c"], "a ran once, b (in flight) twice"
    status, events, dispatch = await thread_status(url, "t1")
    assert (status, dispatch) == ("completed", "done")
    assert events.count("run.recovered") == 1 and events.count("run.completed") == 1
    assert stats["done"] == 1


@pytest.mark.asyncio
async def test_a_paused_worker_past_its_lease_is_fenced_after_sigcont(tmp_path: Path) -> None:
    url = store_url("sqlite", tmp_path)
    async with open_store(url) as store:
        await submit(store, "t1", "steps", {}, dispatch_id="d1")
    paused = spawn(url, "w1", tmp_path)
    second: subprocess.Popen[str] | None = None
    try:
        await asyncio.to_thread(wait_for, (tmp_path / "b.started").exists, "b to start")
        os.kill(paused.pid, signal.SIGSTOP)

        async def lease_expired() -> bool:
            async with open_store(url) as store:
                snap = await store.read("t1")
                assert snap is not None and snap.claim is not None
                return snap.claim.expires_at < datetime.now(UTC)

        await asyncio.to_thread(
            wait_for, lambda: asyncio.run(lease_expired()), "the paused lease to expire"
        )
        second = spawn(url, "w2", tmp_path)

        def completed() -> bool:
            return asyncio.run(thread_status(url, "t1"))[0] == "completed"

        await asyncio.to_thread(wait_for, completed, "the successor to finish")
        _, events_before, _ = await thread_status(url, "t1")
        (tmp_path / "release-b").write_text("go")
        os.kill(paused.pid, signal.SIGCONT)
        stats = await asyncio.to_thread(stop, paused)
    finally:
        if paused.poll() is None:
            os.kill(paused.pid, signal.SIGCONT)
            await asyncio.to_thread(kill, paused)
        if second is not None:
            await asyncio.to_thread(stop, second)
    assert stats["fenced"] == 1 and stats["done"] == 0, stats
    status, events, dispatch = await thread_status(url, "t1")
    assert events == events_before, "the woken worker recorded nothing"
    assert (status, dispatch) == ("completed", "done")
    assert effects(tmp_path).count("c") == 1


@pytest.mark.asyncio
async def test_a_dispatch_that_kills_its_worker_ends_indeterminate_once(tmp_path: Path) -> None:
    url = store_url("sqlite", tmp_path)
    async with open_store(url) as store:
        await submit(store, "t1", "crasher", {}, dispatch_id="d1", max_attempts=2)
    for attempt in range(1, 4):
        worker = spawn(url, f"w{attempt}", tmp_path)
        if attempt < 3:
            await asyncio.to_thread(wait_for, crashes(tmp_path, attempt), "a crash")
            await asyncio.to_thread(worker.communicate, None, 30)
            assert worker.returncode == -signal.SIGKILL
            continue

        def settled() -> bool:
            return asyncio.run(thread_status(url, "t1"))[2] == "done"

        try:
            await asyncio.to_thread(wait_for, settled, "the exhausted dispatch to settle")
        finally:
            await asyncio.to_thread(stop, worker)
    status, events, dispatch = await thread_status(url, "t1")
    assert (status, dispatch) == ("indeterminate", "done")
    assert events.count("run.indeterminate") == 1
    assert effects(tmp_path).count("crash") == 2, "the exhausted claim ran nothing"
