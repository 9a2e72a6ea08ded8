"""Worker processes of ``tests.pgfleet_child`` and the checks of what they leave behind:
every run ended once, the ``replay="never"`` tool ran at most once per thread (and exactly
once for each completed run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from wakeful.store.contract import Store

ROOT = Path(__file__).resolve().parent.parent
ENDINGS = ("run.completed", "run.failed", "run.cancelled", "run.indeterminate")


def spawn(url: str, wake_url: str, worker_id: str, directory: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.pgfleet_child", url, wake_url, worker_id, str(directory)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def wait_for(check: Callable[[], bool], what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def stop(child: subprocess.Popen[str]) -> dict[str, int]:
    """SIGTERM, wait, and return the stats the worker printed."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err[-3000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


def kill(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
    child.communicate(timeout=30)


def charges(directory: Path) -> Counter[str]:
    path = directory / "charges.txt"
    return Counter(path.read_text().split()) if path.exists() else Counter()


async def endings(store: Store, threads: list[str]) -> dict[str, list[str]]:
    """The terminal events of each thread's history, in order."""
    found = {}
    for thread in threads:
        events = await store.events_after(thread, 0, 1000)
        found[thread] = [e.type for e in events if e.type in ENDINGS]
    return found


async def check_fleet(store: Store, threads: list[str], directory: Path) -> dict[str, int]:
    """Assert the fleet's promises over ``threads``; returns how the runs ended."""
    ended = await endings(store, threads)
    once = {t: e for t, e in ended.items() if len(e) != 1}
    assert once == {}, f"runs that did not end exactly once: {once}"
    ran = charges(directory)
    twice = {t: n for t, n in ran.items() if n > 1}
    assert twice == {}, f"the never tool ran twice: {twice}"
    completed = [t for t, e in ended.items() if e == ["run.completed"]]
    assert all(ran[t] == 1 for t in completed), "a completed run's charge is missing"
    assert set(ran) <= set(threads)
    return dict(Counter(e[0] for e in ended.values()))
