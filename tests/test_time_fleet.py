"""Time across a fleet of real worker processes on PostgreSQL (issue 38): every tick of a
schedule fired and run once, none early, with a worker SIGKILLed and restarted; a run asleep
(in a graph node, or in an agent's tool) whose worker is SIGKILLed is woken and finished once
by another worker, after its wake time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.postgres_support import ROOT, Databases, open_test_store
from wakeful.fleet import submit
from wakeful.fleet.schedules import pause_schedule, schedule, schedule_dispatch_id
from wakeful.fleet.ticks import tick_label

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.asyncio]

TTL = 1.0
TICKS = 20
EVERY = 0.5


def spawn(url: str, worker_id: str, directory: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.time_child", url, worker_id, str(directory), str(TTL)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def effects(directory: Path) -> list[list[str]]:
    path = directory / "effects.txt"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


async def until(check: Callable[[], object], what: str, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def up(directory: Path, worker_id: str, pid: int) -> Callable[[], bool]:
    return lambda: (directory / f"{worker_id}.{pid}.up").exists()


def stop(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()


async def test_every_tick_runs_once_and_none_early_across_a_sigkill(
    pg_databases: Databases, tmp_path: Path
) -> None:
    url = await pg_databases.clone()
    store = await open_test_store(url)
    children = [spawn(url, "w1", tmp_path), spawn(url, "w2", tmp_path)]
    try:
        for child, wid in zip(children, ("w1", "w2"), strict=True):
            await until(up(tmp_path, wid, child.pid), f"{wid} to start")
        made = await schedule(
            store,
            "ticker",
            target="tick",
            every=EVERY,
            thread_template="tick-{tick}",
            catch_up="all",
            max_catch_up=100,
            overlap="allow",
        )
        assert made.next_fire_at is not None
        ticks = [made.next_fire_at + timedelta(seconds=EVERY * k) for k in range(TICKS)]
        threads = {f"tick-{tick_label(t).replace('-', '').replace(':', '')}": t for t in ticks}

        def ran() -> set[str]:
            return {e[1] for e in effects(tmp_path) if e[0] == "tick"}

        await until(lambda: len(ran() & set(threads)) >= TICKS // 3, "a third of the ticks")
        os.kill(children[0].pid, signal.SIGKILL)  # mid-way: w1 dies with whatever it held
        children[0].communicate(timeout=10)
        await asyncio.sleep(1.0)
        children.append(spawn(url, "w1", tmp_path))  # and comes back
        await until(lambda: set(threads) <= ran(), "every tick to run", deadline=30)
        await pause_schedule(store, "ticker")
        # what the store holds: one dispatch per tick, each done, its run completed once
        for thread, tick in threads.items():
            d = await store.get_dispatch(schedule_dispatch_id("ticker", tick))
            assert d is not None and d.thread_id == thread, (thread, d)

            async def done(dispatch_id: str = d.dispatch_id) -> bool:
                found = await store.get_dispatch(dispatch_id)
                return found is not None and found.status == "done"

            end = time.monotonic() + 10
            while not await done():
                assert time.monotonic() < end, d
                await asyncio.sleep(0.05)
            runs = await store.runs(thread)
            assert [(r.run_id, r.status) for r in runs] == [(f"run-{d.dispatch_id}", "completed")]
            assert len(await store.list_dispatches(thread_id=thread)) == 1
        # none early: each tick's node ran at or after its tick (one clock: same host)
        for line in effects(tmp_path):
            if line[0] == "tick" and line[1] in threads:
                started = datetime.fromtimestamp(float(line[3]), UTC)
                assert started >= threads[line[1]], (line, threads[line[1]])
        per_tick = [e[1] for e in effects(tmp_path) if e[0] == "tick" and e[1] in threads]
        # a SIGKILL between a node's effect and its commit may repeat that node once (the
        # run is still recorded once, above); anything more is a double firing
        assert len(per_tick) - len(set(per_tick)) <= 1, per_tick
    finally:
        stop(children)
        await store.close()


async def test_a_run_asleep_whose_worker_is_killed_is_finished_once_by_another(
    pg_databases: Databases, tmp_path: Path
) -> None:
    url = await pg_databases.clone()
    store = await open_test_store(url)
    first = spawn(url, "w1", tmp_path)
    children = [first]
    try:
        await until(up(tmp_path, "w1", first.pid), "w1 to start")
        await submit(store, "t1", "sleeper", {}, dispatch_id="d1")

        async def asleep() -> bool:
            snap = await store.read("t1")
            if snap is None or snap.checkpoint is None or snap.claim is not None:
                return False
            return "wake_at" in snap.checkpoint.metadata

        end = time.monotonic() + 20
        while not await asleep():
            assert time.monotonic() < end, effects(tmp_path)
            await asyncio.sleep(0.02)
        snap = await store.read("t1")
        assert snap is not None and snap.checkpoint is not None
        wake_at = datetime.fromisoformat(snap.checkpoint.metadata["wake_at"])
        os.kill(first.pid, signal.SIGKILL)  # the worker that ran it dies while it sleeps
        first.communicate(timeout=10)
        second = spawn(url, "w2", tmp_path)
        children.append(second)

        def finished() -> bool:
            return any(e[0] == "c" for e in effects(tmp_path))

        await until(finished, "the run to finish after its sleep", deadline=30)
        lines = effects(tmp_path)
        assert [e[0] for e in lines] == ["a", "nap", "nap", "woke", "c"], lines
        assert {e[2] for e in lines[:2]} == {str(first.pid)}
        assert {e[2] for e in lines[2:]} == {str(second.pid)}
        woke = datetime.fromtimestamp(float(lines[3][3]), UTC)
        assert woke >= wake_at, (woke, wake_at)
        end = time.monotonic() + 10
        while True:
            snap = await store.read("t1")
            d = await store.get_dispatch("d1")
            if (
                snap
                and snap.checkpoint
                and snap.checkpoint.status == "completed"
                and d
                and (d.status == "done")
            ):
                break
            assert time.monotonic() < end, (snap, d)
            await asyncio.sleep(0.05)
        assert snap.checkpoint.state == {"log": ["a", "woke", "c"]}
    finally:
        stop(children)
        await store.close()


async def test_an_agent_asleep_in_a_tool_whose_worker_is_killed_goes_on_once_elsewhere(
    pg_databases: Databases, tmp_path: Path
) -> None:
    url = await pg_databases.clone()
    store = await open_test_store(url)
    first = spawn(url, "w1", tmp_path)
    children = [first]
    try:
        await until(up(tmp_path, "w1", first.pid), "w1 to start")
        await submit(store, "t2", "tool_sleeper", "nap a little", dispatch_id="d2")

        async def asleep() -> bool:
            snap = await store.read("t2")
            if snap is None or snap.checkpoint is None or snap.claim is not None:
                return False
            return "wake_at" in snap.checkpoint.metadata

        end = time.monotonic() + 20
        while not await asleep():
            assert time.monotonic() < end, effects(tmp_path)
            await asyncio.sleep(0.02)
        snap = await store.read("t2")
        assert snap is not None and snap.checkpoint is not None
        wake_at = datetime.fromisoformat(snap.checkpoint.metadata["wake_at"])
        os.kill(first.pid, signal.SIGKILL)  # the worker dies while the tool's sleep runs
        first.communicate(timeout=10)
        second = spawn(url, "w2", tmp_path)
        children.append(second)

        def finished() -> bool:
            return any(e[:2] == ["model", "reply"] for e in effects(tmp_path))

        await until(finished, "the turn to go on after the sleep", deadline=30)
        lines = effects(tmp_path)
        # the tool ran once, before the kill; its code after the sleep never ran
        assert [e[:2] for e in lines] == [["model", "call"], ["toolnap", "t2"], ["model", "reply"]]
        assert {e[-2] for e in lines[:2]} == {str(first.pid)}
        assert lines[2][-2] == str(second.pid)
        replied = datetime.fromtimestamp(float(lines[2][-1]), UTC)
        assert replied >= wake_at, (replied, wake_at)
        end = time.monotonic() + 10
        while True:
            snap = await store.read("t2")
            d = await store.get_dispatch("d2")
            completed = snap and snap.checkpoint and snap.checkpoint.status == "completed"
            if completed and d and d.status == "done":
                break
            assert time.monotonic() < end, (snap, d)
            await asyncio.sleep(0.05)
        messages = await store.messages("t2")
        assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[2].content == f"slept until {wake_at.isoformat()}"
        assert messages[3].content == "Done."
    finally:
        stop(children)
        await store.close()
