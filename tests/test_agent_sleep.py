"""Durable sleep inside an agent's tool (issue 38 item 3): ``await ctx.sleep(...)`` in a tool
commits the run, releases its claim and records the wake-up; at the wake-up the agent's
turn goes on after the tool (the model reads ``slept until ...``) and the tool is not run
again. On the memory and SQLite stores, through workers and through an embedded Runtime;
time is a manual clock, the model a scripted provider."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.runtime_support import eventually
from wakeful import ManualClock, open_store
from wakeful.agent import Agent, ToolContext, tool
from wakeful.fleet import LocalWake, Registry, Worker, cancel, submit
from wakeful.providers import Scripted
from wakeful.runtime import ClaimPolicy, Runtime
from wakeful.runtime.sleeps import wake_at
from wakeful.store.contract import Store

POLICY = ClaimPolicy(ttl=30, renew_every=10)
START = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def make_agent(counts: dict[str, int], model: Scripted) -> Agent:
    @tool
    async def wait_days(days: int, ctx: ToolContext) -> str:
        """Wait this many days before going on."""
        counts["ran"] = counts.get("ran", 0) + 1
        await ctx.sleep(timedelta(days=days))
        counts["after_sleep"] = counts.get("after_sleep", 0) + 1  # type: ignore[unreachable]
        return "never: the call ended at the sleep"

    @tool
    async def note(text: str) -> str:
        """Write a note."""
        counts["note"] = counts.get("note", 0) + 1
        return f"noted {text}"

    return Agent("follow", model, tools=[wait_days, note])


def follow_up_model() -> Scripted:
    return Scripted.of(
        Scripted.calls(("c1", "wait_days", {"days": 3}), ("c2", "note", {"text": "hi"})),
        Scripted.reply("Followed up."),
    )


@pytest_asyncio.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    clock = ManualClock(START)
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    async with open_store(url, clock=clock) as opened:
        opened.test_clock = clock  # type: ignore[attr-defined]
        yield opened


def _clock(store: Store) -> ManualClock:
    clock: ManualClock = store.test_clock  # type: ignore[attr-defined]
    return clock


async def _latest(store: Store, thread_id: str) -> Any:
    snap = await store.read(thread_id)
    return snap.checkpoint if snap is not None else None


@pytest.mark.asyncio
async def test_a_tool_that_sleeps_releases_the_claim_and_the_turn_goes_on_at_the_wake(
    store: Store,
) -> None:
    clock = _clock(store)
    counts: dict[str, int] = {}
    model = follow_up_model()
    registry = Registry().add("follow", make_agent(counts, model))
    worker = Worker(
        store,
        registry,
        claims=POLICY,
        wake=LocalWake(),
        poll_interval=0.02,
        retry_backoff=0.0,
        clock=clock,
    )
    running = asyncio.create_task(worker.run())
    try:
        await submit(store, "t1", "follow", "Check on me in three days", dispatch_id="d1")

        async def asleep() -> bool:
            return wake_at(await _latest(store, "t1")) is not None

        await eventually(asleep)
        snap = await store.read("t1")
        assert snap is not None and snap.claim is None  # no process holds it while asleep
        assert wake_at(snap.checkpoint) == START + timedelta(days=3)
        d = await store.get_dispatch("d1")
        assert d is not None and d.status == "scheduled"
        assert d.available_at == START + timedelta(days=3)
        assert counts == {"ran": 1, "note": 1} and len(model.requests) == 1
        clock.advance(3 * 86400 - 1)
        await asyncio.sleep(0.1)  # polls meanwhile: not due, nothing runs
        assert (await _latest(store, "t1")).status == "suspended"
        clock.advance(1)

        async def done() -> bool:
            return bool((await _latest(store, "t1")).status == "completed")

        await eventually(done)
    finally:
        await worker.stop(grace=5)
        await asyncio.wait_for(running, 10)
    # the tool ran once, its code after the sleep never; the other call was not run again
    assert counts == {"ran": 1, "note": 1}
    assert len(model.requests) == 2
    messages = await store.messages("t1")
    tool_results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    wake = (START + timedelta(days=3)).isoformat()
    assert tool_results == {"c1": f"slept until {wake}", "c2": "noted hi"}
    # the model's second turn read both results
    second = [m for m in model.requests[1].messages if m.role == "tool"]
    assert sorted(str(m.content) for m in second) == sorted(tool_results.values())
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[-1].content == "Followed up."
    d = await store.get_dispatch("d1")
    assert d is not None and d.status == "done"


@pytest.mark.asyncio
async def test_an_embedded_runtime_wakes_an_agent_whose_tool_sleeps(store: Store) -> None:
    clock = _clock(store)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    counts: dict[str, int] = {}
    model = follow_up_model()
    agent = make_agent(counts, model)
    reply = await agent.run(Runtime(store, POLICY, clock, sleep=sleep), "t1", "later please")
    assert reply.status == "completed" and reply.text == "Followed up."
    assert slept == [3 * 86400.0]
    assert counts == {"ran": 1, "note": 1} and len(model.requests) == 2


@pytest.mark.asyncio
async def test_a_cancel_while_a_tool_sleeps_ends_the_run_and_nothing_runs_again(
    store: Store,
) -> None:
    clock = _clock(store)
    counts: dict[str, int] = {}
    model = follow_up_model()
    registry = Registry().add("follow", make_agent(counts, model))
    wake = LocalWake()
    worker = Worker(store, registry, claims=POLICY, wake=wake, poll_interval=0.02, clock=clock)
    running = asyncio.create_task(worker.run())
    try:
        await submit(store, "t1", "follow", "Check on me", dispatch_id="d1")

        async def asleep() -> bool:
            return wake_at(await _latest(store, "t1")) is not None

        await eventually(asleep)
        await cancel(store, "t1", "no longer needed", wake=wake)

        async def cancelled() -> bool:
            return bool((await _latest(store, "t1")).status == "cancelled")

        await eventually(cancelled)
        clock.advance(4 * 86400)
        await asyncio.sleep(0.1)  # polls past the wake time: nothing wakes
    finally:
        await worker.stop(grace=5)
        await asyncio.wait_for(running, 10)
    assert (await _latest(store, "t1")).status == "cancelled"
    assert counts == {"ran": 1, "note": 1} and len(model.requests) == 1


@pytest.mark.asyncio
async def test_a_tool_sleep_is_checked() -> None:
    ctx = ToolContext(thread_id="t", run_id="r", call_id="c", idempotency_key="k", fencing_token=1)
    from wakeful.errors import InvalidInput

    with pytest.raises(InvalidInput):
        await ctx.sleep(-1)
    with pytest.raises(InvalidInput):
        await ctx.sleep_until(datetime(2026, 12, 8, 9, 0))  # no time zone
