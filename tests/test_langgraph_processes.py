"""``WakefulSaver`` across real processes on one SQLite or PostgreSQL store: a second process gets
``ThreadBusy`` before any node runs; a SIGKILLed holder's thread is resumed elsewhere
without rerunning the node whose write was saved; a SIGSTOPped holder whose claim was taken
over is fenced after SIGCONT and the history does not interleave."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.langgraph_support import fan_out
from tests.postgres_support import Databases
from tests.runtime_support import eventually
from wakeful.errors import ThreadBusy
from wakeful.langgraph import WakefulSaver

pytest_plugins = ["tests.postgres_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
CONFIG: Any = {"configurable": {"thread_id": "t"}}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store the processes share: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    databases: Databases = request.getfixturevalue("pg_databases")
    return asyncio.run(databases.clone())


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.langgraph_child", *args], cwd=ROOT, stderr=subprocess.PIPE
    )


async def _ready(child: subprocess.Popen[bytes], ready: Path) -> None:
    def check() -> bool:
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        return ready.exists()

    await eventually(check, deadline=60)


async def _resume_after_expiry(saver: WakefulSaver, graph: Any) -> dict[str, Any]:
    """Resume the thread once the dead or stalled holder's claim has expired."""
    end = time.monotonic() + 30
    while True:
        try:
            result: dict[str, Any] = await graph.ainvoke(None, CONFIG, durability="sync")
            return result
        except ThreadBusy:
            assert time.monotonic() < end, "the claim never expired"
            await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_busy_then_sigkill_then_resume_reuses_the_saved_write(
    tmp_path: Path, url: str
) -> None:
    counter, ready = tmp_path / "calls.txt", tmp_path / "ready"
    child = _spawn(url, str(counter), str(ready), "child-1")
    try:
        await _ready(child, ready)
        async with WakefulSaver.from_url(url, holder="parent") as saver:
            graph = fan_out(counter).compile(checkpointer=saver)
            with pytest.raises(ThreadBusy) as busy:
                await graph.ainvoke({"log": []}, CONFIG, durability="sync")
            assert busy.value.holder == "child-1"
            assert sorted(counter.read_text().split()) == ["a", "b"], "no node ran here"

            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
            result = await _resume_after_expiry(saver, graph)
        assert sorted(result["log"][:2]) == ["a", "b"] and result["log"][2:] == ["c"]
        calls = counter.read_text().split()
        assert calls.count("a") == 1, "a's write was saved: it did not run again"
        assert calls.count("b") == 2, "b was in flight: it ran again"
        assert calls.count("c") == 1
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        if child.stderr:
            child.stderr.close()


@pytest.mark.asyncio
async def test_sigstopped_holder_is_fenced_after_takeover(tmp_path: Path, url: str) -> None:
    counter, ready, go = tmp_path / "calls.txt", tmp_path / "ready", tmp_path / "go"
    outcome = tmp_path / "ready.outcome"
    child = _spawn(url, str(counter), str(ready), "child-1", str(go))
    try:
        await _ready(child, ready)
        os.kill(child.pid, signal.SIGSTOP)
        async with WakefulSaver.from_url(url, holder="parent") as saver:
            graph = fan_out(counter).compile(checkpointer=saver)
            result = await _resume_after_expiry(saver, graph)
            assert result["log"][2:] == ["c"]
            history = [t async for t in saver.alist(CONFIG)]
            records = len(await saver.store.checkpoints("t", limit=1000))
        go.write_text("go")
        os.kill(child.pid, signal.SIGCONT)
        await eventually(outcome.exists, deadline=60)
        assert outcome.read_text() == "StaleClaim"
        child.wait(timeout=30)
        async with WakefulSaver.from_url(url, holder="reader") as saver:
            assert len(await saver.store.checkpoints("t", limit=1000)) == records
            after = [t async for t in saver.alist(CONFIG)]
        assert [t.checkpoint["id"] for t in after] == [t.checkpoint["id"] for t in history]
        # one chain, newest first: each checkpoint's parent is the next one listed
        parents = [(t.parent_config or {})["configurable"]["checkpoint_id"] for t in after[:-1]]
        assert parents == [t.checkpoint["id"] for t in after[1:]]
        assert after[-1].parent_config is None
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
        child.wait(timeout=30)
        if child.stderr:
            child.stderr.close()
