"""Concurrency keys in a fleet (issue 39.1): four worker processes on PostgreSQL, each with
room for three runs, 40 runs of one key with limit 3, workers SIGKILLed at random and
replaced. The number of runs of the key executing at once, as the runs themselves log it
(a killed worker's runs end at its kill), never exceeds 3 and reaches it; every run ends
once. And fairness across processes: a tenant's single dispatch submitted behind another
tenant's backlog is claimed within the next claim of each worker."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.postgres_support import Databases
from wakeful import open_store
from wakeful.fleet import submit
from wakeful.store.contract import Store

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


def _spawn(dsn: str, worker_id: str, directory: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.keys_child", dsn, worker_id, str(directory)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


async def _all_done(store: Store, ids: list[str]) -> bool:
    for did in ids:
        d = await store.get_dispatch(did)
        if d is None or d.status != "done":
            return False
    return True


def max_overlap(log: str, killed: dict[int, float]) -> tuple[int, set[str]]:
    """The most runs executing at once by the log (a start without its end ends when its
    process was killed), and the runs that ended."""
    open_runs: dict[tuple[int, str], float] = {}
    edges: list[tuple[float, int]] = []
    ended: set[str] = set()
    for line in log.splitlines():
        kind, at, pid, run_id = line.split()
        key = (int(pid), run_id)
        if kind == "start":
            open_runs[key] = float(at)
        else:
            edges += [(open_runs.pop(key), 1), (float(at), -1)]
            ended.add(run_id)
    for (process, _), start in open_runs.items():
        assert process in killed, f"a run of live process {process} never ended"
        edges += [(start, 1), (killed[process], -1)]
    running = peak = 0
    for _, step in sorted(edges):  # at equal times an end (-1) sorts before a start
        running += step
        peak = max(peak, running)
    return peak, ended


async def test_a_key_never_runs_more_than_its_limit_across_sigkilled_workers(
    pg_databases: Databases, tmp_path: Path
) -> None:
    dsn = await pg_databases.clone()
    rng = random.Random(39)
    children = {f"w-{i}": _spawn(dsn, f"w-{i}", tmp_path) for i in range(4)}
    killed: dict[int, float] = {}
    store = await open_store(dsn)
    try:
        end = time.monotonic() + 30
        while not all((tmp_path / f"{n}.up").exists() for n in children):
            assert time.monotonic() < end, "workers did not start"
            await asyncio.sleep(0.05)
        ids = [f"d-{i}" for i in range(40)]
        for i, did in enumerate(ids):
            await submit(
                store, f"t-{i}", "slow", {"i": i}, dispatch_id=did,
                concurrency_key="model:slow", concurrency_limit=3,
            )  # fmt: skip
        spawned = len(children)
        deadline = time.monotonic() + 120
        kills = 0
        while not await _all_done(store, ids):
            assert time.monotonic() < deadline, "the runs did not all end"
            await asyncio.sleep(0.4)
            if kills < 4:  # kill one at random, start a replacement
                name = rng.choice(sorted(children))
                victim = children.pop(name)
                os.kill(victim.pid, signal.SIGKILL)
                killed[victim.pid] = time.time()
                victim.wait()
                kills += 1
                children[f"w-{spawned}"] = _spawn(dsn, f"w-{spawned}", tmp_path)
                spawned += 1
        peak, ended = max_overlap((tmp_path / "runs.log").read_text(), killed)
        assert peak == 3, f"{peak} runs of the key executed at once"
        assert ended == {f"run-{did}" for did in ids}
        for i, did in enumerate(ids):
            events = await store.events_after(f"t-{i}", 0, 1000)
            completed = [e for e in events if e.type == "run.completed"]
            assert [e.run_id for e in completed] == [f"run-{did}"], "each run ends once"
        assert len(killed) == 4
    finally:
        await store.close()
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children.values():
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
