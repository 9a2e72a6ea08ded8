"""Schedules beyond the store contract (issue 38): cron in a time zone through daylight-saving
changes, the definition's validation, and workers firing ticks in their loop. The store
cases (exactly once, catch-up, overlap) are wakeful.testkit.time_cases."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict

import pytest

from tests.runtime_support import eventually
from wakeful import ManualClock
from wakeful.errors import InvalidInput
from wakeful.fleet import Registry, Worker
from wakeful.fleet.schedules import fire_due, schedule, schedule_dispatch_id
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, append
from wakeful.store.memory import MemoryStore


class State(TypedDict):
    log: Annotated[list[str], append]


@pytest.mark.asyncio
async def test_a_0230_tick_on_the_spring_forward_day_fires_once_at_0300() -> None:
    # Europe/Paris skips 02:00-03:00 on 2026-03-29: 02:30 does not exist that day
    clock = ManualClock(datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    store = MemoryStore(clock)
    s = await schedule(
        store, "nightly", "30 2 * * *", target="g", thread="t", timezone="Europe/Paris"
    )
    assert s.next_fire_at == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST
    clock.set(datetime(2026, 3, 29, 1, 0, tzinfo=UTC))
    fired = await fire_due(store)
    assert [d.dispatch_id for d in fired] == ["sched:nightly:2026-03-29T01:00:00Z"]
    clock.set(datetime(2026, 3, 29, 23, 0, tzinfo=UTC))
    assert await fire_due(store) == []
    after = await store.get_schedule("nightly")
    assert after is not None
    assert after.next_fire_at == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)  # 02:30 CEST


@pytest.mark.asyncio
async def test_a_0230_tick_on_the_fall_back_day_fires_once_at_its_first_occurrence() -> None:
    # 02:30 happens twice in Europe/Paris on 2026-10-25 (02:30 CEST, then 02:30 CET)
    clock = ManualClock(datetime(2026, 10, 24, 12, 0, tzinfo=UTC))
    store = MemoryStore(clock)
    await schedule(store, "nightly", "30 2 * * *", target="g", thread="t", timezone="Europe/Paris")
    clock.set(datetime(2026, 10, 25, 3, 0, tzinfo=UTC))  # past both 02:30s
    fired = await fire_due(store)
    assert [d.dispatch_id for d in fired] == ["sched:nightly:2026-10-25T00:30:00Z"]


@pytest.mark.asyncio
async def test_a_schedule_definition_is_checked() -> None:
    store = MemoryStore(ManualClock())
    refusals: list[dict[str, Any]] = [
        {"cron": "61 * * * *", "thread": "t"},
        {"cron": "0 9 * * *", "thread": "t", "timezone": "Mars/Olympus"},
        {"cron": "0 9 * * *", "thread": "t", "thread_template": "x-{date}"},
        {"cron": "0 9 * * *", "thread_template": "x-{weekday}"},
        {"cron": "0 9 * * *", "every": 60, "thread": "t"},
        {"thread": "t"},
        {"cron": "0 9 * * *", "thread": "t", "overlap": "queue"},
        {"cron": "0 9 * * *", "thread": "t", "catch_up": "some"},
        {"cron": "0 9 * * *", "thread": "t", "max_catch_up": 0},
    ]
    for options in refusals:
        with pytest.raises(InvalidInput):
            await schedule(store, "s", target="g", **options)
    assert await store.list_schedules() == []


@pytest.mark.asyncio
async def test_workers_fire_due_ticks_and_run_each_once() -> None:
    clock = ManualClock(datetime(2026, 12, 8, 9, 0, 1, tzinfo=UTC))
    store = MemoryStore(clock)
    runs: list[str] = []

    async def note(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        runs.append(ctx.thread_id)
        return {"log": ["ran"]}

    g = Graph(State, name="digest")
    g.node("note", note)
    g.edge(START, "note")
    registry = Registry(default="digest")
    registry.add("digest", g.compile())
    await schedule(
        store, "digest", target="digest", every=10, thread_template="digest-{tick}", input={}
    )
    policy = ClaimPolicy(ttl=30, renew_every=10)
    workers = [
        Worker(store, registry, claims=policy, poll_interval=0.02, clock=clock, worker_id=w)
        for w in ("w1", "w2")
    ]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        for n in range(1, 4):
            clock.advance(10)
            await eventually(lambda n=n: len(runs) == n)
        await asyncio.sleep(0.1)  # both workers fire again meanwhile: nothing more runs
        ticks = [datetime(2026, 12, 8, 9, 0, s, tzinfo=UTC) for s in (10, 20, 30)]
        assert sorted(runs) == [f"digest-{t.strftime('%Y%m%dT%H%M%SZ')}" for t in ticks]
        dispatches = await store.list_dispatches()
        assert sorted(d.dispatch_id for d in dispatches) == [
            schedule_dispatch_id("digest", t) for t in ticks
        ]
        assert all(d.status == "done" for d in dispatches)
    finally:
        for w in workers:
            await w.stop(grace=5)
        await asyncio.gather(*tasks)


@pytest.mark.asyncio
async def test_waiting_schedules_do_not_keep_others_from_firing() -> None:
    clock = ManualClock(datetime(2026, 12, 8, 9, 0, 1, tzinfo=UTC))
    store = MemoryStore(clock)
    for name in ("a1", "a2", "a3"):
        await schedule(store, name, target="g", every=60, thread=f"t-{name}", overlap="enqueue")
    clock.set(datetime(2026, 12, 8, 9, 1, 0, tzinfo=UTC))
    assert len(await fire_due(store)) == 3  # their runs stay pending: nobody runs them
    await schedule(store, "z", target="g", every=60, thread="t-z")
    clock.set(datetime(2026, 12, 8, 9, 2, 0, tzinfo=UTC))  # all four are due
    fired = [d.dispatch_id for d in await fire_due(store, limit=2)]
    fired += [d.dispatch_id for d in await fire_due(store, limit=2)]
    assert fired == [schedule_dispatch_id("z", datetime(2026, 12, 8, 9, 2, tzinfo=UTC))]
