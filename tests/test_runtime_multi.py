"""Several runtimes over one store: refusals, renewal, takeover without re-running finished
work, fencing of the woken first run, concurrent recovery, and subscriptions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio

from tests.runtime_support import STORE_KINDS, GatedSleep, eventually, open_kind
from wakeful import Event, ManualClock, StaleClaim, StoreUnavailable, ThreadBusy
from wakeful.errors import CheckpointWriteFailed
from wakeful.records import Commit, Receipt
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime, append
from wakeful.store.contract import Store

POLICY = ClaimPolicy(ttl=30, renew_every=10)


class State(TypedDict):
    log: Annotated[list[str], append]


class Env:
    def __init__(self, kind: str, tmp_path: Path, clock: ManualClock, store: Store) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.clock = clock
        self.store = store

    def runtime(self, holder: str, renew_sleep: GatedSleep | None = None) -> Runtime:
        return Runtime(
            self.store,
            POLICY,
            self.clock,
            holder=holder,
            renew_sleep=renew_sleep or GatedSleep(),
        )

    async def reopen(self) -> Store:
        if self.kind != "memory":
            await self.store.close()
            self.store = await open_kind(self.kind, self.tmp_path, self.clock)
        return self.store


@pytest_asyncio.fixture(params=STORE_KINDS)
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    store = await open_kind(request.param, tmp_path, clock)
    environment = Env(request.param, tmp_path, clock, store)
    try:
        yield environment
    finally:
        await environment.store.close()


class Counted:
    """Nodes ``a`` (quick) and ``b`` (blocks on its first call until released) in one
    superstep, then ``c``; counts every call."""

    def __init__(self) -> None:
        self.calls = {"a": 0, "b": 0, "c": 0}
        self.b_started = asyncio.Event()
        self.release_b = asyncio.Event()

    async def a(self, state: dict[str, Any]) -> dict[str, Any]:
        self.calls["a"] += 1
        return {"log": ["a"]}

    async def b(self, state: dict[str, Any]) -> dict[str, Any]:
        self.calls["b"] += 1
        if self.calls["b"] == 1:
            self.b_started.set()
            await self.release_b.wait()
        return {"log": ["b"]}

    async def c(self, state: dict[str, Any]) -> dict[str, Any]:
        self.calls["c"] += 1
        return {"log": ["c"]}

    def graph(self) -> Any:
        g = Graph(State).node("a", self.a).node("b", self.b).node("c", self.c)
        return g.edge(START, "a").edge(START, "b").edge("a", "c").edge("b", "c").compile()


async def a_is_durable(store: Store) -> bool:
    snap = await store.read("t")
    return snap is not None and [w.node for w in snap.writes] == ["a"]


@pytest.mark.asyncio
async def test_a_second_runtime_is_refused_while_the_first_run_is_live(env: Env) -> None:
    nodes = Counted()
    first = await env.runtime("rt-1").start("t", nodes.graph(), {})
    await nodes.b_started.wait()
    second = env.runtime("rt-2")
    for call in (
        second.recover("t", nodes.graph()),
        second.start("t", nodes.graph(), {}),
        second.resume("t", nodes.graph(), {}),
        second.delete_thread("t"),
    ):
        with pytest.raises(ThreadBusy) as busy:
            await call
        assert busy.value.holder == "rt-1"
    nodes.release_b.set()
    assert (await first.result()).state["log"] == ["a", "b", "c"]


@pytest.mark.asyncio
async def test_a_run_that_renews_is_never_taken_over(env: Env) -> None:
    nodes = Counted()
    ticks = GatedSleep()
    handle = await env.runtime("rt-1", ticks).start("t", nodes.graph(), {})
    await nodes.b_started.wait()
    other = env.runtime("rt-2")
    for round_ in range(4):
        env.clock.advance(20)  # past the ttl measured from the previous renewal but one
        await eventually(lambda: ticks.pending == 1)
        ticks.release_all()
        await eventually(lambda r=round_: handle.renewals == r + 1)
        with pytest.raises(ThreadBusy):
            await other.recover("t", nodes.graph())
    nodes.release_b.set()
    assert (await handle.result()).status == "completed"
    assert nodes.calls == {"a": 1, "b": 1, "c": 1}


@pytest.mark.asyncio
async def test_takeover_after_expiry_reuses_finished_work_and_fences_the_first_run(
    env: Env,
) -> None:
    nodes = Counted()
    graph = nodes.graph()
    first = await env.runtime("rt-1").start("t", graph, {})
    await nodes.b_started.wait()
    await eventually(lambda: a_is_durable(env.store))
    env.clock.advance(31)  # rt-1 is paused: its renewal never runs
    second = await env.runtime("rt-2").recover("t", graph)
    outcome = await second.result()
    assert outcome.state["log"] == ["a", "b", "c"]
    assert nodes.calls == {"a": 1, "b": 2, "c": 1}
    events_before = [e.seq for e in await env.store.events_after("t", 0, 1000)]

    nodes.release_b.set()  # the first run wakes up
    with pytest.raises(CheckpointWriteFailed) as stopped:
        await first.result()
    assert isinstance(stopped.value.cause, StaleClaim)
    assert first.status == "fenced"
    assert [e.seq for e in await env.store.events_after("t", 0, 1000)] == events_before
    assert nodes.calls == {"a": 1, "b": 2, "c": 1}, "the fenced run went no further"
    snap = await env.store.read("t")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "completed" and snap.checkpoint.run_id == second.run_id


@pytest.mark.asyncio
async def test_a_retried_commit_that_meets_a_takeover_reports_that_it_was_applied(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    # The answer to a's barrier commit is lost after the store applied it, and another
    # holder takes the thread over before the runtime retries: the retry is fenced, but the
    # run learns (and logs) that its last commit was applied.
    calls = {"a": 0, "b": 0}

    def node(name: str) -> Any:
        def fn(state: dict[str, Any]) -> dict[str, Any]:
            calls[name] += 1
            return {"log": [name]}

        return fn

    builder = Graph(State).node("a", node("a")).node("b", node("b"))
    graph = builder.edge(START, "a").edge("a", "b").compile()
    original = env.store.commit
    applied: list[Receipt] = []

    async def lose_answer_then_take_over(thread_id: str, commit: Commit) -> Receipt:
        receipt = await original(thread_id, commit)
        if commit.checkpoint is not None and commit.checkpoint.parent is not None and not applied:
            applied.append(receipt)
            env.clock.advance(31)
            await env.store.claim(thread_id, "rt-2", 30)
            raise StoreUnavailable("the answer to the commit was lost")
        return receipt

    env.store.commit = lose_answer_then_take_over  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="wakeful.runtime")
    handle = await env.runtime("rt-1").start("t", graph, {})
    with pytest.raises(CheckpointWriteFailed) as stopped:
        await handle.result()
    assert handle.status == "fenced" and calls == {"a": 1, "b": 0}
    (receipt,) = applied
    assert isinstance(stopped.value.cause, StaleClaim)
    assert stopped.value.cause.applied_receipt == receipt
    assert stopped.value.applied_receipt == receipt
    assert "this operation was applied before the claim was lost" in str(stopped.value)
    warned = [r.getMessage() for r in caplog.records if "before the claim was lost" in r.message]
    assert warned == [
        f"commit {receipt.operation_id} on thread t was applied (version {receipt.version}, "
        f"events {list(receipt.events)}) before the claim was lost; the run stops as fenced"
    ]
    snap = await env.store.read("t")
    assert snap is not None and snap.version == receipt.version, "the retry applied nothing"
    assert snap.claim is not None and snap.claim.holder == "rt-2"
    assert await env.store.operation("t", receipt.operation_id or "") == receipt


@pytest.mark.asyncio
async def test_four_runtimes_recovering_an_abandoned_thread_admit_exactly_one(env: Env) -> None:
    nodes = Counted()
    graph = nodes.graph()
    abandoned = await env.runtime("rt-0").start("t", graph, {})
    await nodes.b_started.wait()
    env.clock.advance(31)
    runtimes = [env.runtime(f"rt-{i}") for i in range(1, 5)]
    results = await asyncio.gather(
        *(rt.recover("t", graph) for rt in runtimes), return_exceptions=True
    )
    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, ThreadBusy)]
    assert len(admitted) == 1 and len(refused) == 3
    assert all(r.holder == refused[0].holder for r in refused)
    assert (await admitted[0].result()).status == "completed"
    nodes.release_b.set()
    with pytest.raises(CheckpointWriteFailed):
        await abandoned.result()


async def collect_until_completed(source: AsyncIterator[Any]) -> list[Event]:
    seen: list[Event] = []
    async for item in source:
        if isinstance(item, Event):
            seen.append(item)
            if item.type == "run.completed":
                return seen
    return seen


@pytest.mark.asyncio
async def test_subscriptions_in_two_runtimes_see_the_same_ordered_events(env: Env) -> None:
    nodes = Counted()
    graph = nodes.graph()
    rt1, rt2 = env.runtime("rt-1"), env.runtime("rt-2")
    early = asyncio.create_task(collect_until_completed(rt1.subscribe("t", live=False)))
    handle = await rt1.start("t", graph, {})
    await nodes.b_started.wait()
    await eventually(lambda: a_is_durable(env.store))
    late = asyncio.create_task(collect_until_completed(rt2.subscribe("t", live=False)))
    nodes.release_b.set()
    await handle.result()
    seen_early = await asyncio.wait_for(early, 10)
    seen_late = await asyncio.wait_for(late, 10)
    assert [e.seq for e in seen_early] == list(range(1, len(seen_early) + 1))
    assert seen_late == seen_early
    stored = await env.store.events_after("t", 0, 1000)
    assert stored == seen_early

    store = await env.reopen()
    rt3 = Runtime(store, POLICY, env.clock, holder="rt-3", renew_sleep=GatedSleep())
    resumed = rt3.subscribe("t", after_seq=3, live=False)
    tail = await asyncio.wait_for(collect_until_completed(resumed), 10)
    await resumed.aclose()  # type: ignore[attr-defined]
    assert tail == stored[3:]
