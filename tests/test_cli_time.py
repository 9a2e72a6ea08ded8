"""``wakeful submit --after/--at`` and ``wakeful schedules ...`` through the real entry point
(one subprocess per command, over a SQLite file)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.cli_app import registry
from tests.cli_support import cli, error_line
from wakeful import open_store
from wakeful.fleet import Worker, submit

APP = "tests.cli_app:registry"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def _dispatch(url: str, dispatch_id: str) -> object:
    async def go() -> object:
        async with open_store(url) as store:
            return await store.get_dispatch(dispatch_id)

    return asyncio.run(go())


def test_submit_after_and_at_delay_the_dispatch(url: str) -> None:
    before = datetime.now(UTC)
    done = cli(
        "submit", "t1", "echo", "hi", "--dispatch-id", "d1", "--after", "10m", "--json", store=url
    )
    assert done.returncode == 0, done.stderr
    available = datetime.fromisoformat(json.loads(done.stdout)["available_at"])
    assert before + timedelta(minutes=10) <= available <= datetime.now(UTC) + timedelta(minutes=10)
    done = cli(
        "submit",
        "t2",
        "echo",
        "hi",
        "--dispatch-id",
        "d2",
        "--at",
        "2026-12-08T09:00Z",
        "--json",
        store=url,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["available_at"] == "2026-12-08T09:00:00Z"
    for bad in (
        ["--after", "ten"],
        ["--at", "2026-12-08T09:00"],
        ["--after", "1m", "--at", "2026-12-08T09:00Z"],
    ):
        done = cli("submit", "t3", "echo", "hi", *bad, store=url)
        assert done.returncode == 6, (bad, done.stderr)
        assert "after" in error_line(done) or "at" in error_line(done)
    assert _dispatch(url, "d1") is not None and _dispatch(url, "d2") is not None


def test_schedules_commands(url: str) -> None:
    done = cli(
        "schedules",
        "create",
        "digest",
        "echo",
        "--cron",
        "0 9 * * MON-FRI",
        "--thread-template",
        "digest-{date}",
        "--timezone",
        "Europe/Paris",
        "--input",
        '{"k": 1}',
        "--json",
        store=url,
    )
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["name"] == "digest" and made["input"] == {"k": 1} and made["revision"] == 1
    done = cli("schedules", "create", "tick", "echo", "--every", "30s", "--thread", "t1", store=url)
    assert done.returncode == 0, done.stderr
    listed = cli("schedules", "list", "--json", store=url)
    assert [s["name"] for s in json.loads(listed.stdout)] == ["digest", "tick"]
    assert json.loads(cli("schedules", "pause", "tick", "--json", store=url).stdout)["paused"]
    resumed = json.loads(cli("schedules", "resume", "tick", "--json", store=url).stdout)
    assert resumed["paused"] is False
    fired = cli("schedules", "trigger", "tick", store=url)
    assert fired.returncode == 0 and fired.stdout.startswith("fired sched:tick:trigger:")
    assert cli("schedules", "fire", store=url).stdout.strip() == "nothing due"
    assert cli("schedules", "delete", "tick", store=url).returncode == 0
    missing = cli("schedules", "show", "tick", store=url)
    assert missing.returncode == 3 and "tick" in error_line(missing)
    bad = cli(
        "schedules", "create", "x", "echo", "--cron", "99 * * * *", "--thread", "t", store=url
    )
    assert bad.returncode == 6 and "cron" in error_line(bad)


def test_run_waits_through_a_sleep_and_continues_a_due_one(url: str) -> None:
    done = cli("run", "t1", "napper", "--input", "{}", "--app", APP, "--json", store=url)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed" and result["state"]["total"] == 4

    async def asleep_then_stopped() -> datetime:
        async with open_store(url) as store:
            await submit(store, "t2", "napper", {}, dispatch_id="nap-2")
            worker = Worker(store, registry(), poll_interval=0.05)
            running = asyncio.create_task(worker.run())
            while True:
                snap = await store.read("t2")
                cp = snap.checkpoint if snap is not None else None
                if cp is not None and "wake_at" in cp.metadata:
                    break
                await asyncio.sleep(0.02)
            await worker.stop(5)
            await running
            return datetime.fromisoformat(cp.metadata["wake_at"])

    wake_at = asyncio.run(asleep_then_stopped())
    shown = cli("threads", "show", "t2", store=url)
    assert shown.returncode == 0 and "status sleeping until" in shown.stdout, shown.stdout
    shown_runs = cli("threads", "runs", "t2", "--json", store=url)
    [latest] = json.loads(shown_runs.stdout)
    assert latest["run_id"] == "run-nap-2" and latest["status"] == "sleeping", latest
    assert datetime.fromisoformat(latest["wake_at"]) == wake_at
    listed = cli("dispatches", "list", "--thread", "t2", store=url)
    until = f"scheduled until {wake_at.isoformat(timespec='seconds')}"
    assert listed.returncode == 0 and until in listed.stdout, listed.stdout
    while datetime.now(UTC) <= wake_at:  # nothing runs it meanwhile: no worker is left
        time.sleep(0.05)
    done = cli("run", "t2", "tally", "--input", '{"numbers": [1]}', "--app", APP, "--json",
               store=url)  # fmt: skip
    assert done.returncode == 0, done.stderr

    async def runs() -> list[tuple[str, str]]:
        async with open_store(url) as store:
            return [(r.run_id, r.status) for r in await store.runs("t2")]

    finished = asyncio.run(runs())
    assert ("run-nap-2", "completed") in finished and len(finished) == 2, finished
