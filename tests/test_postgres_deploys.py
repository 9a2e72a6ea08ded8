"""A rolling deploy on PostgreSQL (issue 40): two v1 worker processes run 30 runs that wait
for approval and later sleep durably; two v2 workers start; one v1 worker gets SIGTERM, the
other SIGKILL, while approved runs are in flight (charging, asleep, shipping). Every run
ends exactly once, each on v1 code or moved to v2 under its policy (as its events say),
nothing is held, every run slept and woke, and the never-replayed step ran once per run."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.postgres_support import ROOT, Databases
from wakeful import open_store
from wakeful.fleet import resume, submit

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio, pytest.mark.slow]

RUNS = 30
PIN_GRACE = 1.0


def spawn(dsn: str, worker_id: str, directory: Path, version: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.deploy_child", dsn, worker_id, str(directory), version,
         str(PIN_GRACE)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


async def until(check: object, what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def effects(directory: Path) -> list[tuple[str, str, str]]:
    path = directory / "effects.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(n, t, v) for n, t, v in (line.split() for line in lines)]


async def test_a_rolling_deploy_ends_every_run_once(
    pg_databases: Databases, tmp_path: Path
) -> None:
    dsn = await pg_databases.clone()
    threads = [f"job-{i:02}" for i in range(RUNS)]
    children: list[subprocess.Popen[str]] = []
    store = await open_store(dsn)
    try:
        old = [spawn(dsn, f"w-v1-{i}", tmp_path, "v1") for i in range(2)]
        children += old
        for thread in threads:
            await submit(store, thread, "job", {}, dispatch_id=f"d-{thread}")

        async def statuses() -> dict[str, str | None]:
            found: dict[str, str | None] = {}
            for thread in threads:
                snap = await store.read(thread)
                found[thread] = snap.checkpoint.status if snap and snap.checkpoint else None
            return found

        async def all_suspended() -> bool:
            return set((await statuses()).values()) == {"suspended"}

        await until(all_suspended, "every run waiting for approval on v1")
        tickets = {}
        for thread in threads:
            snap = await store.read(thread)
            assert snap is not None and snap.checkpoint is not None
            assert snap.checkpoint.metadata["version"] == "v1"
            tickets[thread] = snap.checkpoint.metadata["tickets"][0]["id"]
        # the first half is approved while only v1 runs; then the deploy starts
        for thread in threads[: RUNS // 2]:
            await resume(store, thread, {tickets[thread]: True}, dispatch_id=f"r-{thread}")
        children += [spawn(dsn, f"w-v2-{i}", tmp_path, "v2") for i in range(2)]
        await until(
            lambda: asyncio.sleep(0, all((tmp_path / f"w-v2-{i}.up").exists() for i in range(2))),
            "the v2 workers up",
        )
        # in flight: a v1 worker is in the middle of an approved run's slow step
        await until(
            lambda: asyncio.sleep(0, any(n == "charge" for n, _, _ in effects(tmp_path))),
            "an approved run in flight",
        )
        old[0].send_signal(signal.SIGTERM)
        os.kill(old[1].pid, signal.SIGKILL)
        await asyncio.to_thread(old[0].wait, 30)
        await asyncio.to_thread(old[1].wait, 30)
        assert old[0].returncode == 0, "a graceful stop"
        for thread in threads[RUNS // 2 :]:  # approved after the old version left
            await resume(store, thread, {tickets[thread]: True}, dispatch_id=f"r-{thread}")

        async def all_ended() -> bool:
            return all(s not in ("running", "suspended") for s in (await statuses()).values())

        await until(all_ended, "every run ended", deadline=90.0)
        assert set((await statuses()).values()) == {"completed"}
        depths = await store.queue_depths()
        assert depths["quarantined"] == 0 and depths["pending"] == 0, depths
        done = effects(tmp_path)
        charges = Counter(t for n, t, _ in done if n == "charge")
        unknown = [t for n, t, _ in done if n == "charge-unknown"]
        for thread in threads:
            events = [e for e in await store.events_after(thread, 0, 1000)]
            types = [e.type for e in events]
            assert types.count("run.completed") == 1, (thread, types)
            assert "run.failed" not in types and "run.held" not in types, (thread, types)
            moved = [e.data for e in events if e.type == "run.version_changed"]
            shipped_on = {v for n, t, v in done if n == "ship" and t == thread}
            if moved:  # its version left: moved to v2 under the default policy
                assert [(m["from"], m["to"], m["policy"]) for m in moved] == [
                    ("v1", "v2", "continue")
                ], (thread, moved)
            else:  # finished on v1 code
                assert shipped_on == {"v1"}, (thread, shipped_on, types)
            assert ("woke", thread) in {(n, t) for n, t, _ in done}, "every run slept and woke"
            # the never-replayed step: charged once, or (a crash inside it) never again
            assert charges[thread] + unknown.count(thread) >= 1, thread
            assert charges[thread] <= 1, (thread, charges[thread])
        for thread in threads[RUNS // 2 :]:  # approved after every v1 worker left
            types = [e.type for e in await store.events_after(thread, 0, 1000)]
            assert "run.version_changed" in types, (thread, types)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
        await store.close()
