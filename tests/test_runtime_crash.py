"""A process running a graph is killed with SIGKILL mid-superstep; another recovers the run
and the side effects show finished tasks ran exactly once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.runtime_child import build
from tests.runtime_support import kill_when_ready, store_url
from wakeful import ManualClock, open_store
from wakeful.runtime import ClaimPolicy, Runtime

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_sigkill_mid_superstep_then_recover_runs_finished_tasks_once(
    kind: str, tmp_path: Path
) -> None:
    url = store_url(kind, tmp_path)
    counter, ready = tmp_path / "calls.txt", tmp_path / "ready"
    argv = ["tests.runtime_child", url, str(counter), str(ready)]
    await asyncio.to_thread(kill_when_ready, argv, [ready])
    assert counter.read_text().split() == ["a", "b"]

    # the parent's clock is past the dead child's claim expiry
    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
    store = await open_store(url, clock=clock)
    try:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="parent")
        outcome = await (await runtime.recover("t", build(counter, hang_b=False))).result()
        assert outcome.status == "completed"
        assert sorted(outcome.state["log"][:2]) == ["a", "b"] and outcome.state["log"][2] == "c"
        calls = counter.read_text().split()
        assert calls.count("a") == 1, "a had finished: its result was reused"
        assert calls.count("b") == 2, "b was in flight: it ran again"
        assert calls.count("c") == 1
        types = [e.type for e in await store.events_after("t", 0, 1000)]
        assert types.count("run.recovered") == 1 and types[-1] == "run.completed"
    finally:
        await store.close()
