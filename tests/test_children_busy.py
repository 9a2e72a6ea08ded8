"""A child spawned onto a busy thread (issue 43, ``ctx.spawn(..., thread_id=, if_busy=)``):
each busy-thread policy of docs/busy-threads.md, decided by the store against the thread as
it is at the spawn, and durable (the node runs again after its join and its spawn returns
the same child: one dispatch, one ``child.spawned`` event, one run). Workers in this process
over the memory, file and SQLite stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.postgres_support import open_test_store
from tests.runtime_support import STORE_KINDS, eventually, open_kind
from tests.test_children import Env
from wakeful import ManualClock
from wakeful.errors import ChildFailed, InvalidInput, TenantMismatch, ThreadBusy
from wakeful.fleet import cancel, resume, submit
from wakeful.runtime import NodeContext
from wakeful.runtime.children import ChildRun, child_dispatch_id

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture(params=STORE_KINDS)
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    async with await open_kind(request.param, tmp_path, clock) as store:
        environment = Env(store, clock)
        try:
            yield environment
        finally:
            await environment.close()


def spawner(env: Env, name: str, policy: str, n: int) -> Any:
    """A parent that spawns ``double`` onto the thread ``kid`` with ``policy`` and joins it
    (its node runs twice: before the join suspends it and after the child's end)."""

    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        env.count(name)
        try:
            child = await ctx.spawn("double", {"n": n}, thread_id="kid", if_busy=policy)
        except ThreadBusy as busy:
            return {"errors": [f"busy: {busy.run_id}"]}
        try:
            outcome = await ctx.join(child)
        except ChildFailed as failed:
            return {"errors": [f"{failed.status}: {failed.error}"]}
        return {"results": [outcome.state["out"], outcome.run_id]}

    return boss


async def busy_kid(env: Env) -> None:
    """The thread ``kid`` busy with a run of ``waiter`` suspended on its question."""
    await submit(env.store, "kid", "waiter", {"n": 0}, dispatch_id="k0", wake=env.wake)
    await env.ended("kid", "suspended")


async def spawned_once(env: Env, parent: str) -> ChildRun:
    events = await env.store.events_after(parent, 0, 1000)
    kids = [ChildRun.of(e.data) for e in events if e.type == "child.spawned"]
    assert len(kids) == 1, "a node that ran again did not record its spawn again"
    return kids[0]


async def kid_events(env: Env) -> list[str]:
    return [e.type for e in await env.store.events_after("kid", 0, 1000)]


async def test_reject_raises_thread_busy_at_the_spawn_and_stores_nothing(env: Env) -> None:
    env.add("boss", spawner(env, "boss", "reject", 5))
    env.worker("w1")
    await busy_kid(env)
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    assert done.state["errors"] == ["busy: run-k0"]
    events = await env.store.events_after("p", 0, 1000)
    assert [e for e in events if e.type == "child.spawned"] == []
    still = await env.latest("kid")
    assert still is not None and still.run_id == "run-k0" and still.status == "suspended"
    assert "double-5" not in env.calls


async def test_reject_on_a_free_thread_starts_the_child_once(env: Env) -> None:
    env.add("boss", spawner(env, "boss", "reject", 5))
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    kid = await spawned_once(env, "p")
    assert done.state["results"] == [10, kid.run_id]
    assert env.calls["boss"] == 2 and env.calls["double-5"] == 1
    d = await env.store.get_dispatch(child_dispatch_id(kid))
    assert d is not None and d.kind == "start" and d.if_busy == "reject" and d.status == "done"
    assert (await kid_events(env)).count("run.started") == 1
    cp = await env.latest("kid")
    assert cp is not None and cp.metadata["parent"] == {"thread": "p", "run_id": done.run_id}


@pytest.mark.parametrize("policy", ["interrupt", "rollback"])
async def test_interrupt_and_rollback_end_the_busy_run_and_the_child_runs_once(
    env: Env, policy: str
) -> None:
    env.add("boss", spawner(env, "boss", policy, 6))
    env.worker("w1")
    await busy_kid(env)
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    kid = await spawned_once(env, "p")
    assert done.state["results"] == [12, kid.run_id]
    assert env.calls["double-6"] == 1 and env.calls["boss"] == 2
    events = await env.store.events_after("kid", 0, 1000)
    ended = [e for e in events if e.run_id == "run-k0" and e.type.startswith("run.")]
    kinds = [e.type for e in ended]
    ending = "run.rolled_back" if policy == "rollback" else "run.interrupted"
    assert kinds[-1] == ending
    assert ended[-1].data["interrupted_by"] == child_dispatch_id(kid)
    assert ended[-1].data["interrupted_by_run"] == kid.run_id
    started = [e for e in events if e.type == "run.started"]
    assert [e.run_id for e in started] == ["run-k0", kid.run_id]


async def test_coalesce_folds_two_parents_children_into_one_run_both_joins_get_it(
    env: Env,
) -> None:
    env.add("first", spawner(env, "first", "coalesce", 1))
    env.add("second", spawner(env, "second", "coalesce", 2))
    env.worker("w1")
    await busy_kid(env)
    await submit(env.store, "p1", "first", {}, dispatch_id="d1", wake=env.wake)
    await env.ended("p1", "suspended")
    await submit(env.store, "p2", "second", {}, dispatch_id="d2", wake=env.wake)
    await env.ended("p2", "suspended")
    one, two = await spawned_once(env, "p1"), await spawned_once(env, "p2")
    for kid in (one, two):
        d = await env.store.get_dispatch(child_dispatch_id(kid))
        assert d is not None and d.status == "queued" and d.if_busy == "coalesce"
    await cancel(env.store, "kid", "make room", wake=env.wake)  # the thread frees
    first, second = await env.ended("p1"), await env.ended("p2")
    # one run answered both: the inputs folded in submit order (n=1 then n=2)
    assert first.state["results"] == [4, one.run_id]
    assert second.state["results"] == [4, one.run_id]
    assert env.calls.get("double-2") == 1 and "double-1" not in env.calls
    answered = await env.store.get_dispatch(child_dispatch_id(two))
    assert answered is not None and answered.answered_by == child_dispatch_id(one)
    started = [e.run_id for e in await env.store.events_after("kid") if e.type == "run.started"]
    assert started == ["run-k0", one.run_id]


async def test_an_unknown_policy_is_refused_before_anything_is_recorded(env: Env) -> None:
    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        try:
            await ctx.spawn("double", {"n": 1}, thread_id="kid", if_busy="shove")
        except InvalidInput as refused:
            return {"errors": [str(refused)]}
        return {}

    env.add("boss", boss)
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    assert "if_busy" in done.state["errors"][0]
    assert await env.store.read("kid") is None


async def test_a_parent_cancelled_before_its_busy_policy_child_starts_fails_it(
    env: Env,
) -> None:
    """The cascade reaches a queued child spawned with a policy: it never starts."""
    env.add("boss", spawner(env, "boss", "coalesce", 3))
    env.worker("w1")
    await busy_kid(env)
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    await env.ended("p", "suspended")
    kid = await spawned_once(env, "p")
    await cancel(env.store, "p", "never mind", wake=env.wake)
    await env.ended("p", "cancelled")
    await cancel(env.store, "kid", "make room", wake=env.wake)

    async def refused() -> bool:
        cp = await env.latest("kid")
        return cp is not None and cp.run_id == kid.run_id and cp.status == "failed"

    await eventually(refused, deadline=20)
    assert "double-3" not in env.calls


async def test_an_interrupting_spawn_repeated_by_a_second_attempt_spares_its_own_child(
    env: Env,
) -> None:
    """The first attempt spawns with ``interrupt`` and hangs before recording anything;
    the child starts and suspends (its thread is busy with it); the attempt's lease lapses
    and another worker runs the node again: its spawn finds the child's dispatch stored and
    returns the same child, without interrupting it. One dispatch, one child run."""
    attempts: list[str] = []

    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        child = await ctx.spawn("waiter", {"n": 1}, thread_id="kid", if_busy="interrupt")
        attempts.append(child.run_id)
        if len(attempts) == 1:
            await env.gate.wait()  # the first attempt hangs here: nothing is recorded
        return {"results": [(await ctx.join(child)).state["out"]]}

    env.add("boss", boss)
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    await eventually(lambda: len(attempts) == 1)
    await env.ended("kid", "suspended")  # the child runs while its parent's attempt hangs
    env.clock.advance(31)  # past the claim's ttl: the parent's lease lapses
    env.worker("w2")
    await env.ended("p", "suspended")
    env.gate.set()
    assert len(attempts) >= 2 and len(set(attempts)) == 1, "the same child both times"
    child = await env.latest("kid")
    assert child is not None and child.run_id == attempts[0] and child.status == "suspended"
    assert "run.interrupted" not in await kid_events(env)
    (ticket,) = child.metadata["tickets"]
    await resume(env.store, "kid", {ticket["id"]: 7}, wake=env.wake)
    done = await env.ended("p")
    assert done.state["results"] == [7]
    assert env.calls["waiter"] == 2, "asked once, and ran again on its resume"
    assert (await kid_events(env)).count("run.started") == 1
    events = await env.store.events_after("p", 0, 1000)
    assert [e.type for e in events].count("child.spawned") == 1


@pytest.mark.postgres
@pytest.mark.parametrize("policy", ["reject", "interrupt", "rollback", "coalesce"])
async def test_every_policy_on_postgresql(pg_databases: Any, policy: str) -> None:
    """The same policies with the PostgreSQL store (its own admission, in SQL)."""
    store = await open_test_store(await pg_databases.clone())
    env = Env(store, ManualClock())  # the workers' clock; the store's is the server's
    try:
        env.add("boss", spawner(env, "boss", policy, 4))
        env.worker("w1")
        await busy_kid(env)
        await submit(store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
        if policy == "reject":
            done = await env.ended("p")
            assert done.state["errors"] == ["busy: run-k0"]
            assert "child.spawned" not in [e.type for e in await store.events_after("p")]
            return
        if policy == "coalesce":
            await env.ended("p", "suspended")
            await cancel(store, "kid", "make room", wake=env.wake)
        done = await env.ended("p")
        kid = await spawned_once(env, "p")
        assert done.state["results"] == [8, kid.run_id]
        assert env.calls["double-4"] == 1
        events = await store.events_after("kid", 0, 1000)
        assert [e.run_id for e in events if e.type == "run.started"] == ["run-k0", kid.run_id]
        ended = [e.type for e in events if e.run_id == "run-k0"][-1]
        expected = {"interrupt": "run.interrupted", "rollback": "run.rolled_back"}
        assert ended == expected.get(policy, "run.cancelled")
    finally:
        await env.close()
        await store.close()


async def test_a_busy_policy_spawn_onto_another_tenants_thread_is_refused(env: Env) -> None:
    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        try:
            await ctx.spawn("double", {"n": 1}, thread_id="kid", if_busy="interrupt")
        except TenantMismatch as refused:
            return {"errors": [type(refused).__name__]}
        return {}

    env.add("boss", boss)
    env.worker("w1")
    await submit(env.store, "kid", "waiter", {"n": 0}, tenant="beta", wake=env.wake)
    await env.ended("kid", "suspended")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", tenant="acme", wake=env.wake)
    done = await env.ended("p")
    assert done.state["errors"] == ["TenantMismatch"]
    still = await env.latest("kid")
    assert still is not None and still.status == "suspended", "nothing of acme reached it"
