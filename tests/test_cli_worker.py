"""``wakeful worker`` as an operator sees it: its JSON log lines for retried, recovered and
crash-recovered dispatches, and its exit summary."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.cli_support import ROOT, WAKEFUL, cli_env
from wakeful import open_store
from wakeful.fleet import submit


def start_worker(url: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [WAKEFUL, "worker", "--app", "tests.cli_app:registry", "--poll", "0.1",
         "--log-format", "json", *args],
        cwd=ROOT,
        env=cli_env(url, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def wait_for(url: str, check: Any, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    async def poll() -> None:
        deadline = time.monotonic() + timeout
        async with open_store(url) as store:
            while not await check(store):
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "timed out"
                await asyncio.sleep(0.05)

    asyncio.run(poll())


def stop(proc: subprocess.Popen[str]) -> tuple[str, list[dict[str, Any]]]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return out, [json.loads(line) for line in err.splitlines() if line.strip()]


def done(*ids: str) -> Any:
    async def check(store: Any) -> bool:
        found = [await store.get_dispatch(i) for i in ids]
        return all(d is not None and d.status == "done" for d in found)

    return check


def of(lines: list[dict[str, Any]], dispatch_id: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("dispatch_id") == dispatch_id]


def test_worker_logs_retries_recoveries_and_a_summary(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"

    async def enqueue() -> None:
        async with open_store(url) as s:
            await submit(s, "t-flaky", "flaky", {}, dispatch_id="d-flaky")
            await submit(s, "t-drop", "dropper", "hi", dispatch_id="d-drop")

    asyncio.run(enqueue())
    proc = start_worker(url)
    try:
        wait_for(url, done("d-flaky", "d-drop"), proc)
    finally:
        out, lines = stop(proc)
    flaky = of(lines, "d-flaky")
    started = [line for line in flaky if line["message"].startswith("dispatch d-flaky started")]
    assert [(line["attempt"], line["target"], line["thread_id"]) for line in started] == [
        (1, "flaky", "t-flaky"),
        (2, "flaky", "t-flaky"),
    ]
    retry = [x for x in flaky if x.get("outcome") == "retry" and x["level"] == "warning"]
    assert len(retry) == 1 and "the first call of flaky fails on purpose" in retry[0]["reason"]
    recovered = [line for line in flaky if "recovering run run-d-flaky" in line["message"]]
    assert len(recovered) == 1 and recovered[0]["attempt"] == 2
    ends = [line for line in flaky if "duration" in line]
    assert [line["outcome"] for line in ends] == ["retry", "done"]
    assert "run run-d-flaky completed" in ends[-1]["reason"]
    assert all(line["duration"] >= 0 for line in ends)
    plans = [line for line in lines if line.get("plan") and line.get("run_id") == "run-d-drop"]
    assert [p["plan"] for p in plans] == ["R1"] and plans[0]["logger"] == "wakeful.agent"
    assert of(lines, "d-drop")[-1]["outcome"] == "done"
    assert "stopped" in out and "retried" in out and "claimed" in out  # the summary table


def test_a_dispatch_of_a_killed_worker_is_recovered_and_logged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"

    async def enqueue() -> None:
        async with open_store(url) as s:
            await submit(s, "t-b", "blocker", {}, dispatch_id="d-b")

    asyncio.run(enqueue())
    first = start_worker(url, "--ttl", "1", CLI_APP_BLOCK="1")

    async def running(store: Any) -> bool:
        snap = await store.read("t-b")
        return snap is not None and snap.checkpoint is not None

    try:
        wait_for(url, running, first)
    finally:
        first.kill()
        first.communicate(timeout=30)
    second = start_worker(url, "--ttl", "5")
    try:
        wait_for(url, done("d-b"), second)
    finally:
        _, lines = stop(second)
    recovered = [line for line in of(lines, "d-b") if "recovering run" in line["message"]]
    assert len(recovered) == 1 and recovered[0]["attempt"] == 2
    assert recovered[0]["run_id"] == "run-d-b"
    assert of(lines, "d-b")[-1]["outcome"] == "done"
