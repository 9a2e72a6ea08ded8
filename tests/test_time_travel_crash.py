"""A process replaying a thread from an earlier checkpoint (a branch) is killed with SIGKILL
during the replay's first superstep; another process recovers the run. The new branch is
finished once (its finished task reused, its in-flight task run again, the rest once) and
the abandoned branch is not revived: it stays as it was, off the head's line."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import wakeful
from tests.runtime_support import kill_when_ready, store_url
from tests.travel_child import build
from wakeful import ManualClock, open_store
from wakeful.runtime import ClaimPolicy, Runtime


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_sigkill_in_a_replays_first_superstep_then_recovery_finishes_the_branch_once(
    kind: str, tmp_path: Path
) -> None:
    url = store_url(kind, tmp_path)
    counter, ready = tmp_path / "calls.txt", tmp_path / "ready"
    store = await open_store(url)
    try:
        runtime = Runtime(store, holder="first")
        original = await (await runtime.start("t", build(counter, hang_b=False), {})).result()
        assert original.status == "completed"
        line = await wakeful.history(store, "t")
        old_head = line[0]
        fork_point = next(e for e in line if e.nodes == ["a"])  # after a: b and d are next
        assert fork_point.step == 1
    finally:
        await store.close()
    assert sorted(counter.read_text().split()) == ["a", "b", "c", "d"]

    argv = ["tests.travel_child", url, str(counter), str(ready), fork_point.checkpoint_id]
    await asyncio.to_thread(kill_when_ready, argv, [ready])

    # the parent's clock is past the dead child's claim expiry
    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
    store = await open_store(url, clock=clock)
    try:
        snap = await store.read("t")
        assert snap is not None and snap.checkpoint is not None and snap.branch == 1
        assert snap.checkpoint.run_id == "run-replay" and snap.checkpoint.status == "running"
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="parent")
        outcome = await (await runtime.recover("t", build(counter, hang_b=False))).result()
        assert outcome.status == "completed" and outcome.run_id == "run-replay"
        assert outcome.state == original.state
        calls = counter.read_text().split()
        # the original run: a, b, d, c; the replay (from after a): b and d, killed; recovery:
        # b again (it was in flight), d reused (its result was durable), c once
        assert (calls.count("a"), calls.count("b"), calls.count("d"), calls.count("c")) == (
            1,
            3,
            2,
            2,
        )
        events = await store.events_after("t", 0, 1000)
        replay = [e.type for e in events if e.run_id == "run-replay"]
        assert replay.count("run.recovered") == 1 and replay.count("run.completed") == 1
        assert [e.type for e in events].count("thread.branched") == 1
        # the abandoned branch is not revived: the head is the new branch's, the old head
        # is as it was and off the head's line, and nothing was committed after it there
        after = await wakeful.history(store, "t", limit=100)
        assert after[0].head and after[0].branch == 1 and after[0].status == "completed"
        old = next(e for e in after if e.checkpoint_id == old_head.checkpoint_id)
        assert old.status == "completed" and not old.current and old.branch == 0
        assert [e.checkpoint_id for e in after if e.branch == 0 and not e.current] == [
            e.checkpoint_id for e in line if e.step is not None and e.step > 1
        ]
        assert (await store.branches("t"))[0].old_head == old_head.checkpoint_id
    finally:
        await store.close()
