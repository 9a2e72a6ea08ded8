"""The worker over one store in one process: runs, redelivery, budgets, cancellation,
messages between threads and retries. Expiry is driven by a manual clock."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio

from tests.runtime_support import eventually
from wakeful import Commit, Done, ManualClock, StaleClaim, StoreUnavailable
from wakeful.fleet import LocalWake, Registry, Worker, cancel, resume, send_message, submit
from wakeful.providers.base import ProviderError
from wakeful.records import Dispatch
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, Runtime, append
from wakeful.store.memory import MemoryStore

POLICY = ClaimPolicy(ttl=30, renew_every=10)


class State(TypedDict):
    log: Annotated[list[str], append]


class Env:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.store = MemoryStore(self.clock)
        self.wake = LocalWake()
        self.calls: dict[str, int] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.workers: list[tuple[Worker, asyncio.Task[None]]] = []
        self.registry = Registry(default="echo")
        self.registry.add("echo", self.graph("echo", ["a", "b"]))

    def node(self, name: str) -> Any:
        async def fn(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
            self.calls[name] = self.calls.get(name, 0) + 1
            gate = self.gates.get(name)
            if gate is not None:
                await gate.wait()
            return {"log": [name]}

        return fn

    def graph(self, graph_name: str, names: list[str]) -> Any:
        g = Graph(State, name=graph_name)
        for name in names:
            g.node(name, self.node(name))
        g.edge(START, names[0])
        for a, b in itertools.pairwise(names):
            g.edge(a, b)
        return g.compile()

    def worker(self, worker_id: str, **options: Any) -> Worker:
        worker = Worker(
            self.store,
            self.registry,
            concurrency=options.pop("concurrency", 2),
            claims=options.pop("claims", POLICY),
            wake=self.wake,
            worker_id=worker_id,
            poll_interval=0.05,
            retry_backoff=0.0,
            clock=self.clock,
            **options,
        )
        self.workers.append((worker, asyncio.create_task(worker.run())))
        return worker

    async def dispatch(self, dispatch_id: str) -> Dispatch:
        d = await self.store.get_dispatch(dispatch_id)
        assert d is not None
        return d

    async def status(self, thread_id: str) -> str | None:
        snap = await self.store.read(thread_id)
        return snap.checkpoint.status if snap and snap.checkpoint else None

    async def close(self) -> None:
        for gate in self.gates.values():
            gate.set()
        for worker, task in self.workers:
            await worker.stop(grace=5)
            await asyncio.wait_for(task, 10)


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


async def dispatch_status(env: Env, dispatch_id: str, status: str) -> None:
    await eventually(lambda: _has_status(env, dispatch_id, status))


async def _has_status(env: Env, dispatch_id: str, status: str) -> bool:
    return (await env.dispatch(dispatch_id)).status == status


@pytest.mark.asyncio
async def test_a_submitted_run_completes_and_its_dispatch_is_done(env: Env) -> None:
    env.worker("w1")
    first = await submit(env.store, "t1", "echo", {"log": ["in"]}, dispatch_id="d1", wake=env.wake)
    again = await submit(env.store, "t1", "echo", {"log": ["in"]}, dispatch_id="d1")
    assert again == first, "submit is idempotent by dispatch id"
    await dispatch_status(env, "d1", "done")
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "completed" and snap.checkpoint.run_id == "run-d1"
    assert snap.checkpoint.state == {"log": ["in", "a", "b"]} and snap.claim is None
    assert env.calls == {"a": 1, "b": 1}


@pytest.mark.asyncio
async def test_the_ending_commit_settles_the_dispatch_in_the_same_write(env: Env) -> None:
    settles: list[str] = []
    original_settle = env.store.settle

    async def counting_settle(dispatch_id: str, token: int, outcome: Any) -> Any:
        settles.append(dispatch_id)
        return await original_settle(dispatch_id, token, outcome)

    env.store.settle = counting_settle  # type: ignore[method-assign]
    env.worker("w1")
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "done")
    assert settles == [], "the run's last commit settled it; no separate settle"
    snap = await env.store.read("t1")
    assert snap is not None and snap.claim is None and snap.checkpoint is not None
    assert snap.checkpoint.status == "completed"


@pytest.mark.asyncio
async def test_a_lost_response_to_the_ending_commit_is_answered_by_its_receipt(env: Env) -> None:
    original_commit = env.store.commit
    lost: list[str] = []

    async def lose_ending_response(thread_id: str, commit: Commit) -> Any:
        receipt = await original_commit(thread_id, commit)
        if commit.settle is not None and not lost:
            lost.append(commit.settle.dispatch_id)
            raise StoreUnavailable("the response of the ending commit was lost")
        return receipt

    env.store.commit = lose_ending_response  # type: ignore[method-assign]
    env.worker("w1")
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "done")
    assert lost == ["d1"]
    assert env.calls == {"a": 1, "b": 1}
    assert (await env.dispatch("d1")).attempts == 1
    events = await env.store.events_after("t1", 0, 1000)
    assert [e.type for e in events].count("run.completed") == 1
    await eventually(lambda: env.workers[0][0].stats.done == 1)
    assert env.workers[0][0].stats.fenced == 0


@pytest.mark.asyncio
async def test_crash_after_commit_before_settle_runs_nothing_again(env: Env) -> None:
    # A run that ended without settling its lease (its process died in between): the
    # thread says completed while the dispatch is still leased to the dead holder.
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1")
    (lease,) = await env.store.claim_next("dead-worker", 30)
    runtime = Runtime(env.store, POLICY, env.clock)
    handle = await runtime.start(
        "t1", env.registry.get("echo").graph, {}, run_id="run-d1", claim=lease.claim
    )
    await handle.result()
    assert (await env.status("t1")) == "completed"
    assert (await env.dispatch("d1")).status == "leased"
    env.clock.advance(31)
    env.worker("w1")
    await env.wake.notify()
    await dispatch_status(env, "d1", "done")
    assert env.calls == {"a": 1, "b": 1}, "the finished run was not run again"
    assert (await env.dispatch("d1")).attempts == 2


@pytest.mark.asyncio
async def test_a_paused_worker_is_fenced_and_a_successor_finishes_without_rerunning(
    env: Env,
) -> None:
    env.gates["b"] = asyncio.Event()
    env.worker("w1", concurrency=1)
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1", wake=env.wake)
    await eventually(lambda: env.calls.get("b") == 1)
    env.clock.advance(31)  # w1 is "paused": its renewal (10 s of real time) never comes
    env.calls["b"] = 0
    gate = env.gates.pop("b")
    env.worker("w2", concurrency=1)
    await env.wake.notify()
    await eventually(lambda: env.calls.get("b") == 1)
    await dispatch_status(env, "d1", "done")
    assert env.calls["a"] == 1
    events_before = await env.store.events_after("t1", 0, 1000)
    gate.set()  # w1 wakes up
    await eventually(lambda: env.workers[0][0].stats.fenced == 1)
    assert await env.store.events_after("t1", 0, 1000) == events_before
    assert (await env.dispatch("d1")).holder == "w2.g1"


@pytest.mark.asyncio
async def test_an_exhausted_budget_terminalises_the_run_once(env: Env) -> None:
    env.gates["a"] = asyncio.Event()
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1", max_attempts=2)
    for attempt in (1, 2):
        env.worker(f"w{attempt}", concurrency=1)
        await env.wake.notify()
        await eventually(lambda n=attempt: env.calls.get("a") == n)
        env.clock.advance(31)  # that worker is gone as far as the store can tell
    env.worker("w3", concurrency=1)
    await env.wake.notify()
    await dispatch_status(env, "d1", "done")
    assert env.calls.get("a") == 2, "the exhausted claim ran nothing"
    assert (await env.status("t1")) == "indeterminate"
    types = [e.type for e in await env.store.events_after("t1", 0, 1000)]
    assert types.count("run.indeterminate") == 1
    assert (await env.dispatch("d1")).attempts == 3


@pytest.mark.asyncio
async def test_quarantine_before_the_next_claim_keeps_the_work_parked(env: Env) -> None:
    env.gates["a"] = asyncio.Event()
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1", max_attempts=1)
    env.worker("w1", concurrency=1)
    await env.wake.notify()
    await eventually(lambda: env.calls.get("a") == 1)
    env.clock.advance(31)
    parked = await env.store.quarantine("d1")
    assert parked.status == "quarantined"
    w2 = env.worker("w2", concurrency=1)
    await env.wake.notify()
    await eventually(lambda: w2.stats.polls >= 3)  # w2 looked at the queue several times
    assert (await env.dispatch("d1")).status == "quarantined"
    assert (await env.status("t1")) == "running"
    env.gates.pop("a").set()
    await env.store.requeue("d1")
    await env.wake.notify()
    await dispatch_status(env, "d1", "done")
    assert (await env.status("t1")) == "completed"


@pytest.mark.asyncio
async def test_cancel_while_running_fences_the_owner_and_ends_cancelled(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wakeful.fleet")
    env.gates["b"] = asyncio.Event()
    env.worker("w1", concurrency=2)
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1", wake=env.wake)
    await eventually(lambda: env.calls.get("b") == 1)
    intent = await cancel(env.store, "t1", "user changed their mind", wake=env.wake)
    await dispatch_status(env, intent.dispatch_id, "done")
    assert (await env.status("t1")) == "cancelled"
    env.gates.pop("b").set()
    await eventually(lambda: env.workers[0][0].stats.fenced == 1)
    assert (await env.status("t1")) == "cancelled"
    types = [e.type for e in await env.store.events_after("t1", 0, 1000)]
    assert types[-1] == "run.cancelled" and "run.completed" not in types
    assert (await env.dispatch("d1")).status == "done"
    [ended] = [r for r in caplog.records if r.getMessage().startswith("dispatch d1 ended")]
    assert "ended cancelled" in ended.getMessage(), ended.getMessage()
    assert "the run was cancelled (user changed their mind)" in ended.getMessage()
    assert "newer owner" not in ended.getMessage()


@pytest.mark.asyncio
async def test_suspended_runs_park_and_resume_dispatches_continue_them(env: Env) -> None:
    def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"log": [f"answer={ctx.interrupt('ok?')}"]}

    env.registry.add(
        "asker", Graph(State, name="asker").node("ask", ask).edge(START, "ask").compile()
    )
    env.worker("w1")
    await submit(env.store, "t1", "asker", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "awaiting")
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    [ticket] = snap.checkpoint.metadata["tickets"]
    await resume(env.store, "t1", {ticket["id"]: "yes"}, dispatch_id="r1", wake=env.wake)
    await dispatch_status(env, "r1", "done")
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.state == {"log": ["answer=yes"]}


@pytest.mark.asyncio
async def test_messages_between_threads_are_delivered_and_consumed_once(env: Env) -> None:
    def sender(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        ctx.send("t-b", {"log": ["hello from a"]}, correlation_id="c-1")
        return {"log": ["sent"]}

    env.registry.add(
        "sender", Graph(State, name="sender").node("send", sender).edge(START, "send").compile()
    )
    env.worker("w1")
    await submit(env.store, "t-a", "sender", {}, dispatch_id="d1", wake=env.wake)

    async def b_done() -> bool:
        return (await env.status("t-b")) == "completed"

    await eventually(b_done)
    snap = await env.store.read("t-b")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.state == {"log": ["hello from a", "a", "b"]}
    assert await env.store.inbox("t-b") == []
    message_dispatches = [
        d for d in await env.store.list_dispatches(thread_id="t-b") if d.kind == "message"
    ]
    assert len(message_dispatches) == 1 and message_dispatches[0].status == "done"
    ext = await send_message(
        env.store, "t-b", {"log": ["external"]}, message_id="m-ext", wake=env.wake
    )
    await send_message(env.store, "t-b", {"log": ["external"]}, message_id="m-ext")
    await dispatch_status(env, ext.dispatch_id, "done")
    assert env.calls["a"] == 2, "the external message started exactly one more run"


@pytest.mark.asyncio
async def test_a_transient_failure_is_retried_with_the_run_recovered(env: Env) -> None:
    failures = {"left": 2}

    def flaky(state: dict[str, Any]) -> dict[str, Any]:
        if failures["left"]:
            failures["left"] -= 1
            raise ProviderError("overloaded", "busy", status=529)
        return {"log": ["flaky"]}

    graph = Graph(State, name="flaky").node("x", env.node("x")).node("flaky", flaky)
    env.registry.add("flaky", graph.edge(START, "x").edge("x", "flaky").compile())
    env.worker("w1")
    await submit(env.store, "t1", "flaky", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "done")
    assert (await env.status("t1")) == "completed"
    assert env.calls["x"] == 1, "the finished task was reused on every retry"
    assert (await env.dispatch("d1")).attempts == 3


@pytest.mark.asyncio
async def test_the_last_failed_attempt_says_no_attempt_is_left(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="wakeful.fleet")

    def broken(state: dict[str, Any]) -> dict[str, Any]:
        raise ProviderError("overloaded", "busy", status=529)

    env.registry.add(
        "broken", Graph(State, name="broken").node("x", broken).edge(START, "x").compile()
    )
    env.worker("w1")
    await submit(env.store, "t1", "broken", {}, dispatch_id="d1", max_attempts=2, wake=env.wake)
    await dispatch_status(env, "d1", "done")
    assert (await env.status("t1")) == "indeterminate"
    failed = [r.getMessage() for r in caplog.records if "failed;" in r.getMessage()]
    assert len(failed) == 2, failed
    assert failed[0].startswith("dispatch d1 attempt 1 of 2 failed; retrying in 0.0 s: ")
    assert failed[1].startswith(
        "dispatch d1 attempt 2 of 2 failed; no attempt left; its run is recorded "
        "indeterminate in 0.0 s unless it is quarantined first (wakeful quarantine add d1): "
    )
    assert "retrying" not in failed[1]


@pytest.mark.asyncio
async def test_settle_with_a_stale_token_after_cancel_is_refused(env: Env) -> None:
    await submit(env.store, "t1", "echo", {}, dispatch_id="d1")
    [lease] = await env.store.claim_next("manual", 30)
    await cancel(env.store, "t1")
    with pytest.raises(StaleClaim):
        await env.store.settle("d1", lease.claim.token, Done())


@pytest.mark.asyncio
async def test_an_unknown_target_is_refused_once_not_retried(env: Env) -> None:
    env.worker("w1")
    await submit(env.store, "t1", "no-such-target", {}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "done")
    d = await env.dispatch("d1")
    assert d.attempts == 1
    events = await env.store.events_after("t1", 0, 100)
    assert [e.type for e in events] == ["dispatch.refused"]
    assert "no-such-target" in str(events[0].data)


@pytest.mark.asyncio
async def test_work_of_another_tenant_never_reaches_the_owners_thread(env: Env) -> None:
    """Work queued for alpha, then the thread deleted and taken by beta: the worker retires
    alpha's dispatch without writing anything to beta's thread (no run, no refusal event,
    no ``run.indeterminate`` naming it), and beta's thread is unchanged."""
    runtime = Runtime(env.store, POLICY, env.clock)
    queued = await submit(env.store, "t1", "echo", {"log": ["alpha"]}, tenant="alpha")
    await env.store.delete_thread("t1")
    handle = await runtime.start("t1", env.registry.get("echo").graph, tenant="beta")
    await handle.result()
    before = await env.store.read("t1")
    assert before is not None and before.tenant == "beta"
    events_before = await env.store.events_after("t1")
    env.worker("w1")
    await dispatch_status(env, queued.dispatch_id, "done")
    after = await env.store.read("t1")
    assert after is not None and after.version == before.version and after.tenant == "beta"
    assert await env.store.events_after("t1") == events_before
