"""Helpers for runtime tests: stores by kind, a controllable sleeper, polling."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from wakeful import ManualClock, open_store
from wakeful.store.contract import Store

STORE_KINDS = ["memory", "file", "sqlite"]


def store_url(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory://"
    module = {"file": "wakeful.store.file", "sqlite": "wakeful.store.sqlite"}[kind]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"the {kind} store is not in this checkout yet")
    if kind == "file":
        return f"file://{tmp_path / 'root'}"
    return f"sqlite:///{tmp_path / 'store.db'}"


async def open_kind(kind: str, tmp_path: Path, clock: ManualClock) -> Store:
    return await open_store(store_url(kind, tmp_path), clock=clock)


class GatedSleep:
    """A ``sleep`` for the runtime that returns only when the test lets it: renewals and
    retries then happen exactly when the test says."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    def release_all(self) -> int:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        return len(waiters)

    @property
    def pending(self) -> int:
        return sum(1 for w in self._waiters if not w.done())


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool], deadline: float = 10.0
) -> None:
    """Poll ``check`` until true, failing after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while True:
        result: Any = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > end:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.005)


def mark_ready(path: Path, text: str) -> None:
    """Write a ready file for ``kill_when_ready`` in one step (a temporary file renamed into
    place): the parent acts the moment the file exists, so it must never see it empty."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def kill_when_ready(argv: list[str], ready: list[Path], deadline: float = 30.0) -> None:
    """Run ``python -m argv...`` from the repository root until every ``ready`` file exists,
    then SIGKILL it (blocking: call it through ``asyncio.to_thread``)."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen([sys.executable, "-m", *argv], cwd=root, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + deadline
        while not all(path.exists() for path in ready):
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            assert time.monotonic() < end, f"{argv[0]} never got ready"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        if child.stderr:
            child.stderr.close()
