"""Acceptance of child runs (issue 43 item 2) on PostgreSQL with real processes: a supervisor
agent delegates to three child runs and joins them, on two worker processes, each SIGKILLed
once at a random moment (and replaced). Each child ran once, the parent completed once with
the three results, and no worker slot was held by the waiting parent (each worker's
concurrency gauge, sampled by the worker itself)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.postgres_support import ROOT, Databases, open_test_store
from wakeful.fleet import submit
from wakeful.runtime.children import ChildRun

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio, pytest.mark.slow]

TTL = 1.0


def start(dsn: str, worker_id: str, directory: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.children_child", dsn, worker_id, str(directory), str(TTL)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def stop(proc: subprocess.Popen[str], up: Path) -> None:
    """SIGTERM once the worker is up (its handler installed), then wait for its exit."""
    end = time.monotonic() + 30
    while not up.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def effects(directory: Path) -> list[str]:
    path = directory / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


async def until(check: Callable[[], object], what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def gauge(directory: Path, worker_id: str) -> dict[str, Any]:
    return dict(json.loads((directory / f"{worker_id}.gauge").read_text()))


async def test_a_supervisor_joins_three_children_through_two_killed_workers(
    pg_databases: Databases, tmp_path: Path
) -> None:
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for worker_id in ("w1", "w2"):
            procs[worker_id] = start(dsn, worker_id, tmp_path)
        await until(lambda: (tmp_path / "w1.up").exists() and (tmp_path / "w2.up").exists(), "up")
        await submit(store, "boss", "supervisor", "Research a, b and c.", dispatch_id="d1")

        # First kill: a random moment from the submission until the children are running.
        await asyncio.sleep(rng.uniform(0.0, 1.5))
        kill(procs.pop("w1"))
        procs["w1b"] = start(dsn, "w1b", tmp_path)

        async def waiting() -> bool:
            snap = await store.read("boss")
            cp = snap.checkpoint if snap is not None else None
            asked = {line for line in effects(tmp_path) if line.startswith("start ")}
            return cp is not None and cp.status == "suspended" and len(asked) == 3

        await until(waiting, "the parent to wait on its three running children")
        parent = await store.get_dispatch("d1")
        assert parent is not None and parent.status == "awaiting"
        snap = await store.read("boss")
        assert snap is not None and snap.claim is None, "no process holds the waiting parent"
        assert snap.checkpoint is not None
        joined = {t["question"]["join"]["thread"] for t in snap.checkpoint.metadata["tickets"]}
        assert len(joined) == 3
        alive = [w for w in procs if procs[w].poll() is None]
        await until(lambda: all((tmp_path / f"{w}.gauge").exists() for w in alive), "gauges")
        await asyncio.sleep(0.1)  # fresh samples of both gauges, all taken while it waits
        for worker_id in alive:
            sample = gauge(tmp_path, worker_id)
            running = [str(d) for d in sample["running"]]
            assert sample["busy"] == len(running)
            assert float(sample["gauge"]) <= len(running)
            assert "d1" not in running and not any(d.startswith("join-") for d in running)
        busy = sum(int(gauge(tmp_path, w)["busy"]) for w in alive)
        assert busy <= 3, "only the children hold slots"
        gauges = sum(float(gauge(tmp_path, w)["gauge"]) for w in alive)
        assert gauges <= 3, "the running-dispatches gauge counts only the children"

        # Second kill: a random moment around the children's end and the parent's wake-up.
        (tmp_path / "release").write_text("go")
        await asyncio.sleep(rng.uniform(0.0, 0.6))
        kill(procs.pop("w2"))
        procs["w2b"] = start(dsn, "w2b", tmp_path)

        async def completed() -> bool:
            snap = await store.read("boss")
            cp = snap.checkpoint if snap is not None else None
            return cp is not None and cp.status == "completed"

        await until(completed, f"the parent to complete (seed {seed})", deadline=90)
        snap = await store.read("boss")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.state["final"] == "results: answer a, answer b, answer c"
        events = await store.events_after("boss", 0, 1000)
        assert [e.type for e in events].count("run.completed") == 1
        assert [e.type for e in events].count("run.started") == 1
        kids = [ChildRun.of(e.data) for e in events if e.type == "child.spawned"]
        assert len(kids) == 3 and len({k.thread_id for k in kids}) == 3
        for kid in kids:
            child_events = [e.type for e in await store.events_after(kid.thread_id, 0, 1000)]
            assert child_events.count("run.started") == 1, (seed, kid.thread_id, child_events)
            assert child_events.count("run.completed") == 1, (seed, kid.thread_id, child_events)
            answers = [m for m in await store.messages(kid.thread_id) if m.role == "assistant"]
            assert len(answers) == 1
        asked = sorted(line for line in effects(tmp_path) if line.startswith("start "))
        assert sorted(set(asked)) == ["start a", "start b", "start c"]
        tool_results = [m for m in await store.messages("boss") if m.role == "tool"]
        assert sorted(str(m.content) for m in tool_results) == ["answer a", "answer b", "answer c"]
    finally:
        (tmp_path / "release").write_text("go")  # a gated child would hold up a graceful stop
        for worker_id, proc in procs.items():
            if proc.poll() is None:
                await asyncio.to_thread(stop, proc, tmp_path / f"{worker_id}.up")
        await store.close()


async def test_a_handoff_survives_sigkills_between_the_handoff_and_the_childs_end(
    pg_databases: Databases, tmp_path: Path
) -> None:
    """``desk`` hands the conversation to ``billing``; both worker processes are SIGKILLed
    while the child runs (after the handoff, before the child's end), and one of their
    replacements again at a random moment around the child's end and the parent's wake-up.
    The child ran to one end, the parent completed once with the child's reply as its
    final answer, and the desk's model was asked once (nothing after the handoff)."""
    dsn = await pg_databases.clone()
    store = await open_test_store(dsn)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for worker_id in ("w1", "w2"):
            procs[worker_id] = start(dsn, worker_id, tmp_path)
        await until(lambda: (tmp_path / "w1.up").exists() and (tmp_path / "w2.up").exists(), "up")
        await submit(store, "front", "desk", "I want my money back", dispatch_id="h1")
        await until(lambda: "billing start" in effects(tmp_path), "the handoff's child to run")
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        for worker_id in ("w1", "w2"):
            kill(procs.pop(worker_id))
        snap = await store.read("front")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.status == "suspended", "the desk waits for the child it handed to"
        for worker_id in ("w3", "w4"):
            procs[worker_id] = start(dsn, worker_id, tmp_path)
        (tmp_path / "release").write_text("go")
        await asyncio.sleep(rng.uniform(0.0, 0.6))
        victim = rng.choice(["w3", "w4"])
        kill(procs.pop(victim))
        procs["w5"] = start(dsn, "w5", tmp_path)

        async def completed() -> bool:
            snap = await store.read("front")
            cp = snap.checkpoint if snap is not None else None
            return cp is not None and cp.status == "completed"

        await until(completed, f"the desk's run to complete (seed {seed})", deadline=90)
        snap = await store.read("front")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.state["final"] == "refunded"
        events = await store.events_after("front", 0, 1000)
        types = [e.type for e in events]
        assert types.count("run.started") == 1 and types.count("run.completed") == 1
        assert types.count("agent.handed_off") == 1, (seed, types)
        (kid,) = [ChildRun.of(e.data) for e in events if e.type == "child.spawned"]
        assert kid.target == "billing"
        child_events = [e.type for e in await store.events_after(kid.thread_id, 0, 1000)]
        assert child_events.count("run.started") == 1, (seed, child_events)
        assert child_events.count("run.completed") == 1, (seed, child_events)
        assert effects(tmp_path).count("desk turn") == 1, "no desk turn after the handoff"
        roles = [m.role for m in await store.messages("front")]
        assert roles == ["user", "assistant", "tool", "assistant"]
    finally:
        (tmp_path / "release").write_text("go")
        for worker_id, proc in procs.items():
            if proc.poll() is None:
                await asyncio.to_thread(stop, proc, tmp_path / f"{worker_id}.up")
        await store.close()
