"""Child runs (issue 43 item 2): ``ctx.spawn`` records the child in the parent's commit
(an outbox entry the relay delivers once), ``ctx.join`` suspends the parent without its
claim or a worker slot and the child's end resumes it with the child's outcome; a child's
failure raises in the parent; cancelling the parent cancels its children unless detached.
Workers in this process over the memory and SQLite stores; the store's clock is manual."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio

from tests.runtime_support import STORE_KINDS, eventually, open_kind
from wakeful import ManualClock
from wakeful.agent import Agent, ToolContext, tool
from wakeful.errors import ChildFailed, InvalidInput, StoreUnavailable
from wakeful.fleet import LocalWake, Registry, Worker, cancel, submit
from wakeful.fleet.joins import wake_id
from wakeful.providers.scripted import Scripted, calls, reply
from wakeful.records import Checkpoint
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, Runtime, append
from wakeful.runtime.children import JOIN_SCHEMA, ChildRun, child_run_id, plan_child
from wakeful.store.contract import Store
from wakeful.store.memory import MemoryStore
from wakeful.store.projected_queue import message_dispatch_id

POLICY = ClaimPolicy(ttl=30, renew_every=10)


class Job(TypedDict):
    n: int
    out: int


class Boss(TypedDict):
    results: Annotated[list[Any], append]
    errors: Annotated[list[str], append]


class Env:
    def __init__(self, store: Store, clock: ManualClock) -> None:
        self.clock = clock
        self.store = store
        self.wake = LocalWake()
        self.calls: dict[str, int] = {}
        self.gate = asyncio.Event()
        self.registry = Registry()
        self.registry.add("double", self._double())
        self.registry.add("broken", self._broken())
        self.registry.add("waiter", self._waiter())
        self.workers: list[tuple[Worker, asyncio.Task[None]]] = []

    def count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _double(self) -> Any:
        async def compute(state: dict[str, Any]) -> dict[str, Any]:
            self.count(f"double-{state['n']}")
            return {"out": state["n"] * 2}

        return Graph(Job, name="double").node("compute", compute).edge(START, "compute").compile()

    def _broken(self) -> Any:
        async def explode(state: dict[str, Any]) -> dict[str, Any]:
            self.count("broken")
            raise RuntimeError(f"cannot handle {state['n']}")

        return Graph(Job, name="broken").node("explode", explode).edge(START, "explode").compile()

    def _waiter(self) -> Any:
        async def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
            self.count("waiter")
            return {"out": ctx.interrupt("go on?")}

        return Graph(Job, name="waiter").node("ask", ask).edge(START, "ask").compile()

    def add(self, name: str, fn: Any) -> None:
        self.registry.add(
            name, Graph(Boss, name=name).node("boss", fn).edge(START, "boss").compile()
        )

    def worker(self, worker_id: str, concurrency: int = 4, relay: bool = True) -> Worker:
        worker = Worker(
            self.store,
            self.registry,
            relay=relay,
            concurrency=concurrency,
            claims=POLICY,
            wake=self.wake,
            worker_id=worker_id,
            poll_interval=0.02,
            retry_backoff=0.0,
            clock=self.clock,
        )
        self.workers.append((worker, asyncio.create_task(worker.run())))
        return worker

    async def latest(self, thread_id: str) -> Checkpoint | None:
        snap = await self.store.read(thread_id)
        return snap.checkpoint if snap is not None else None

    async def ended(self, thread_id: str, status: str = "completed") -> Checkpoint:
        async def check() -> bool:
            cp = await self.latest(thread_id)
            return cp is not None and cp.status == status

        await eventually(check, deadline=20)
        cp = await self.latest(thread_id)
        assert cp is not None
        return cp

    async def close(self) -> None:
        self.gate.set()
        for worker, task in self.workers:
            await worker.stop(grace=5)
            await asyncio.wait_for(task, 10)


@pytest_asyncio.fixture(params=STORE_KINDS)
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    async with await open_kind(request.param, tmp_path, clock) as store:
        environment = Env(store, clock)
        try:
            yield environment
        finally:
            await environment.close()


def fan_out(env: Env, *, target: str = "double") -> Any:
    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        env.count("boss")
        kids = [await ctx.spawn(target, {"n": n}) for n in (1, 2, 3)]
        try:
            outcomes = await ctx.join_all(kids)
        except ChildFailed as failed:
            return {"errors": [f"{failed.status}: {failed.error}"]}
        return {"results": [o.state["out"] for o in outcomes]}

    return boss


@pytest.mark.asyncio
async def test_a_parent_spawns_three_children_joins_them_and_each_runs_once(env: Env) -> None:
    env.add("boss", fan_out(env))
    worker = env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    assert done.state["results"] == [2, 4, 6]
    assert {k: v for k, v in env.calls.items() if k.startswith("double")} == {
        "double-1": 1,
        "double-2": 1,
        "double-3": 1,
    }
    assert env.calls["boss"] >= 2, "the parent suspended on the join and ran again"
    events = await env.store.events_after("p", 0, 1000)
    spawned = [e.data for e in events if e.type == "child.spawned"]
    assert len(spawned) == 3, "a node that runs again does not record its spawns again"
    kids = [ChildRun.of(s) for s in spawned]
    assert len({k.thread_id for k in kids}) == 3
    for kid in kids:
        assert kid.thread_id.startswith("p:boss:")
        cp = await env.latest(kid.thread_id)
        assert cp is not None and cp.status == "completed" and cp.run_id == kid.run_id
        assert cp.metadata["parent"] == {"thread": "p", "run_id": done.run_id}
        started = [
            e for e in await env.store.events_after(kid.thread_id) if e.type == "run.started"
        ]
        assert started[0].data["parent"] == {"thread": "p", "run_id": done.run_id}
        ident = wake_id(kid.thread_id, kid.run_id)

        async def settled(ident: str = ident) -> bool:
            found = await env.store.get_dispatch(ident)
            return found is not None and found.status == "done"

        # the parent may have read the child's end before the wake-up was enqueued: once
        # the parent ended, a late wake-up has nothing to do
        await eventually(settled)
        wake = await env.store.get_dispatch(ident)
        assert wake is not None and wake.thread_id == "p" and wake.kind == "resume"
    suspended = [e for e in events if e.type == "run.suspended"]
    assert suspended, "the parent waited for its children"
    assert worker.stats.done >= 4


@pytest.mark.asyncio
async def test_a_waiting_parent_holds_no_claim_and_no_worker_slot(env: Env) -> None:
    env.add("boss", fan_out(env, target="waiter"))
    worker = env.worker("w1", concurrency=1)  # one slot: a parent holding it would starve
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)

    async def three_waiting() -> bool:
        return env.calls.get("waiter", 0) == 3 and worker.busy == 0

    await eventually(three_waiting, deadline=20)
    parent = await env.latest("p")
    assert parent is not None and parent.status == "suspended"
    assert [t["schema"] for t in parent.metadata["tickets"]] == [JOIN_SCHEMA] * 3
    snap = await env.store.read("p")
    assert snap is not None and snap.claim is None
    d = await env.store.get_dispatch("d1")
    assert d is not None and d.status == "awaiting"


@pytest.mark.asyncio
async def test_a_child_failure_raises_in_the_parent(env: Env) -> None:
    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        good = await ctx.spawn("double", {"n": 5})
        bad = await ctx.spawn("broken", {"n": 7})
        first = await ctx.join(good)
        try:
            await ctx.join(bad)
        except ChildFailed as failed:
            return {"results": [first.state["out"]], "errors": [f"{failed.status}: {failed.error}"]}
        return {"errors": ["no failure seen"]}

    env.add("boss", boss)
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    assert done.state["results"] == [10]
    assert len(done.state["errors"]) == 1
    assert done.state["errors"][0].startswith("failed: node 'explode' failed: RuntimeError")
    assert "cannot handle 7" in done.state["errors"][0]
    assert env.calls["broken"] == 1


@pytest.mark.asyncio
async def test_an_unknown_target_fails_the_child_and_the_parent_learns(env: Env) -> None:
    env.add("boss", fan_out(env, target="nobody"))
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    assert done.state["errors"] == ["failed: target 'nobody' does not exist"]


@pytest.mark.asyncio
async def test_cancelling_the_parent_cancels_its_children_but_not_a_detached_one(
    env: Env,
) -> None:
    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        kept = await ctx.spawn("waiter", {"n": 1})
        free = await ctx.spawn("waiter", {"n": 2}, detached=True)
        await ctx.join_all([kept, free])
        return {}

    env.add("boss", boss)
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    await eventually(lambda: env.calls.get("waiter", 0) == 2, deadline=20)
    events = await env.store.events_after("p", 0, 100)
    kept, free = (ChildRun.of(e.data) for e in events if e.type == "child.spawned")
    await env.ended(kept.thread_id, "suspended")
    await env.ended(free.thread_id, "suspended")
    await env.ended("p", "suspended")
    await cancel(env.store, "p", "changed my mind", wake=env.wake)
    await env.ended("p", "cancelled")
    gone = await env.ended(kept.thread_id, "cancelled")
    assert gone.run_id == kept.run_id
    await asyncio.sleep(0.2)  # ten polls: nothing touches the detached child
    still = await env.latest(free.thread_id)
    assert still is not None and still.status == "suspended" and still.run_id == free.run_id


@pytest.mark.asyncio
async def test_a_child_joined_in_a_later_node_is_read_from_its_thread(env: Env) -> None:
    async def start(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        env.count("start")
        child = await ctx.spawn("double", {"n": 21})
        return {"results": [child]}

    async def finish(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        env.count("finish")
        outcome = await ctx.join(state["results"][0])
        return {"results": [outcome.state["out"]]}

    g = Graph(Boss, name="later").node("start", start).node("finish", finish)
    env.registry.add("later", g.edge(START, "start").edge("start", "finish").compile())
    env.worker("w1")
    await submit(env.store, "p", "later", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    assert done.state["results"][1] == 42
    assert env.calls["start"] == 1 and env.calls["double-21"] == 1


def test_child_ids_are_deterministic_valid_and_match_the_relayed_dispatch() -> None:
    args = dict(
        parent_thread="p",
        parent_run="run-1",
        step=0,
        task_id="s0-t0",
        node="boss",
        target="double",
        thread_id=None,
        detached=False,
    )
    first = plan_child(position=1, **args)  # type: ignore[arg-type]
    again = plan_child(position=1, **args)  # type: ignore[arg-type]
    other = plan_child(position=2, **args)  # type: ignore[arg-type]
    assert first == again and first.thread_id != other.thread_id
    assert first.run_id == f"run-{message_dispatch_id(first.thread_id, first.spawn_id)}"
    assert first.run_id == child_run_id(first.thread_id, first.spawn_id)
    with pytest.raises(InvalidInput, match="limit is 200"):
        plan_child(position=1, **{**args, "parent_thread": "p" * 195})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="thread of its own"):
        plan_child(position=1, **{**args, "thread_id": "p"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        plan_child(position=1, **{**args, "thread_id": "a/b"})  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_an_agent_delegates_to_another_agent_through_a_child_run(env: Env) -> None:
    from wakeful.agent import delegate

    boss_model = Scripted.of(
        calls(
            ("c1", "ask_researcher", {"request": "capital of France?"}),
            ("c2", "ask_researcher", {"request": "capital of Italy?"}),
        ),
        reply("Paris and Rome."),
    )
    researcher_model = Scripted.of(reply("Paris."), reply("Rome."))
    boss = Agent("boss", boss_model, "Delegate.", [delegate("researcher")])
    env.registry.add("supervisor", boss)
    env.registry.add("researcher", Agent("researcher", researcher_model, "Answer."))
    env.worker("w1")
    await submit(env.store, "chat", "supervisor", "Two capitals?", dispatch_id="d1", wake=env.wake)
    done = await env.ended("chat")
    assert done.state["final"] == "Paris and Rome."
    messages = await env.store.messages("chat")
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    assert sorted(results.values()) == ["Paris.", "Rome."]
    assert all(m.metadata["outcome"] == "ok" for m in messages if m.role == "tool")
    events = await env.store.events_after("chat", 0, 1000)
    kids = [ChildRun.of(e.data) for e in events if e.type == "child.spawned"]
    assert len(kids) == 2 and all(k.target == "researcher" for k in kids)
    asked = set()
    for kid in kids:
        child_messages = await env.store.messages(kid.thread_id)
        assert [m.role for m in child_messages] == ["user", "assistant"]
        asked.add(child_messages[0].content)
    assert asked == {"capital of France?", "capital of Italy?"}
    assert len(boss_model.requests) == 2 and len(researcher_model.requests) == 2


class LosesOneWakeUp(MemoryStore):
    """A memory store whose first enqueue of a parent's wake-up fails, as a store that is
    briefly unreachable (or a worker killed right after the child's ending commit) would."""

    failed = 0

    async def enqueue(self, dispatch: Any) -> Any:
        if dispatch.dispatch_id.startswith("join-") and not self.failed:
            self.failed += 1
            raise StoreUnavailable("the store is briefly unreachable")
        return await super().enqueue(dispatch)


@pytest.mark.asyncio
async def test_a_wake_up_lost_after_the_childs_end_is_enqueued_by_its_redelivery() -> None:
    clock = ManualClock()
    async with LosesOneWakeUp(clock) as store:
        env = Env(store, clock)
        try:

            async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
                child = await ctx.spawn("double", {"n": 4})
                return {"results": [(await ctx.join(child)).state["out"]]}

            env.add("boss", boss)
            env.worker("w1")
            await submit(store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
            done = await env.ended("p")
            assert done.state["results"] == [8]
            assert store.failed == 1
            assert env.calls["double-4"] == 1, "the redelivery did not run the child again"
            (kid,) = [
                ChildRun.of(e.data)
                for e in await store.events_after("p")
                if e.type == "child.spawned"
            ]
            child_dispatch = await store.get_dispatch(kid.run_id.removeprefix("run-"))
            assert child_dispatch is not None and child_dispatch.attempts == 2
            assert child_dispatch.status == "done"
        finally:
            await env.close()


@pytest.mark.asyncio
async def test_a_send_in_a_step_that_is_not_the_last_is_delivered() -> None:
    """The barrier commit of a single-task superstep that is not the run's last carries the
    task's outbox (it was dropped before child runs needed it)."""

    async def first(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        ctx.send("other", {"hi": 1}, message_id="m1")
        return {"out": 1}

    async def second(state: dict[str, Any]) -> dict[str, Any]:
        return {"out": 2}

    store = MemoryStore(ManualClock())
    g = Graph(Job, name="two").node("first", first).node("second", second)
    graph = g.edge(START, "first").edge("first", "second").compile()
    outcome = await (await Runtime(store).start("t", graph, {})).result()
    assert outcome.status == "completed"
    assert await store.relay_outbox() == 1
    assert [m.payload for m in await store.inbox("other")] == [{"hi": 1}]


@pytest.mark.asyncio
async def test_a_child_runs_for_its_parents_tenant(env: Env) -> None:
    env.add("boss", fan_out(env))
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", tenant="acme", wake=env.wake)
    done = await env.ended("p")
    assert done.state["results"] == [2, 4, 6] and done.tenant == "acme"
    for event in await env.store.events_after("p", 0, 1000):
        if event.type == "child.spawned":
            snap = await env.store.read(event.data["thread_id"])
            assert snap is not None and snap.tenant == "acme"
            assert snap.checkpoint is not None and snap.checkpoint.tenant == "acme"
            assert snap.checkpoint.metadata["parent"]["tenant"] == "acme"


@pytest.mark.asyncio
async def test_the_http_api_links_a_parent_and_its_children() -> None:
    from tests.server_support import ALPHA, BETA, running_api
    from wakeful.client import Client

    clock = ManualClock()
    async with MemoryStore(clock) as store:
        env = Env(store, clock)
        try:

            async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
                done = await ctx.spawn("double", {"n": 1})
                waiting = await ctx.spawn("waiter", {"n": 2}, detached=True)
                await ctx.join_all([done, waiting])
                return {}

            env.add("boss", boss)
            env.worker("w1")
            await submit(store, "p", "boss", {}, dispatch_id="d1", tenant="alpha", wake=env.wake)
            await eventually(lambda: env.calls.get("waiter") == 1, deadline=20)
            await env.ended("p", "suspended")
            parent = await env.latest("p")
            assert parent is not None
            async with running_api(store) as api:
                alpha = api.client(ALPHA)
                listed = (await alpha.get("/v1/threads/p/children")).json()["children"]
                assert [(c["target"], c["detached"]) for c in listed] == [
                    ("double", False),
                    ("waiter", True),
                ]
                assert all(c["parent_run_id"] == parent.run_id for c in listed)
                await env.ended(listed[1]["thread_id"], "suspended")
                await env.ended(listed[0]["thread_id"], "completed")
                listed = (await alpha.get("/v1/threads/p/children")).json()["children"]
                assert [c["status"] for c in listed] == ["completed", "suspended"]
                child = (await alpha.get(f"/v1/threads/{listed[0]['thread_id']}")).json()
                assert child["parent"] == {
                    "thread": "p",
                    "run_id": parent.run_id,
                    "tenant": "alpha",
                }
                assert (await alpha.get("/v1/threads/p")).json()["parent"] is None
                other = await alpha.get("/v1/threads/p/children", params={"run_id": "run-x"})
                assert other.json()["children"] == []
                hidden = await api.client(BETA).get("/v1/threads/p/children")
                assert hidden.status_code == 404
                async with Client(api.url, token=ALPHA) as client:
                    page = await client.threads.children("p", run_id=parent.run_id)
                assert [c["thread_id"] for c in page["children"]] == [
                    c["thread_id"] for c in listed
                ]
        finally:
            await env.close()


@pytest.mark.asyncio
async def test_a_child_whose_parent_was_cancelled_before_it_started_never_starts(
    env: Env,
) -> None:
    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        await ctx.join(await ctx.spawn("waiter", {"n": 1}))
        return {}

    env.add("boss", boss)
    env.worker("w1", relay=False)  # the spawn stays staged until the test relays it
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    await env.ended("p", "suspended")
    await cancel(env.store, "p", "changed my mind", wake=env.wake)
    cancelled = await env.ended("p", "cancelled")
    assert await env.store.relay_outbox() == 1
    await env.wake.notify()
    (kid,) = [
        ChildRun.of(e.data) for e in await env.store.events_after("p") if e.type == "child.spawned"
    ]
    failed = await env.ended(kid.thread_id, "failed")
    assert failed.run_id == kid.run_id
    assert failed.metadata["error"] == (
        f"invalid spawn: its parent run {cancelled.run_id} was cancelled before it started"
    )
    assert "waiter" not in env.calls
    assert await env.store.inbox(kid.thread_id) == [], "the spawn was consumed"


@pytest.mark.asyncio
async def test_a_child_that_spends_its_attempts_fails_the_parents_join(env: Env) -> None:
    async def flaky(state: dict[str, Any]) -> dict[str, Any]:
        env.count("flaky")
        raise StoreUnavailable("the service it needs is down")  # retryable: no ending

    env.registry.add("flaky", Graph(Job, name="flaky").node("f", flaky).edge(START, "f").compile())
    env.add("boss", fan_out(env, target="flaky"))
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    assert done.state["errors"] == ["indeterminate: run.indeterminate"]
    assert env.calls["flaky"] == 3 * 5, "five attempts of each of the three children"


@pytest.mark.asyncio
async def test_a_node_of_a_subgraph_spawns_and_joins(env: Env) -> None:
    async def inner(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        env.count("inner")
        outcome = await ctx.join(await ctx.spawn("double", {"n": state["n"]}))
        return {"out": outcome.state["out"]}

    sub = Graph(Job, name="sub").node("inner", inner).edge(START, "inner").compile()
    outer = Graph(Job, name="outer").node("sub", sub).edge(START, "sub").compile()
    env.registry.add("outer", outer)
    env.worker("w1")
    await submit(env.store, "p", "outer", {"n": 9}, dispatch_id="d1", wake=env.wake)
    done = await env.ended("p")
    assert done.state["out"] == 18
    events = await env.store.events_after("p", 0, 1000)
    (kid,) = [ChildRun.of(e.data) for e in events if e.type == "child.spawned"]
    assert kid.thread_id.startswith("p:inner:")
    assert env.calls["double-9"] == 1


class CountsEventReads(MemoryStore):
    reads = 0

    async def events_after(self, thread_id: str, after_seq: int = 0, limit: int = 100) -> Any:
        self.reads += 1
        return await super().events_after(thread_id, after_seq, limit)


@pytest.mark.asyncio
async def test_a_cancel_reads_only_the_cancelled_runs_events_for_its_children() -> None:
    from wakeful.fleet.joins import run_children
    from wakeful.records import Commit, EventDraft

    store = CountsEventReads(ManualClock())
    claim = await store.claim("p", "seeder", 30)

    async def record(*events: EventDraft) -> None:
        await store.commit("p", Commit(token=claim.token, events=events))

    for _ in range(6):  # an earlier run's long history: 3,000 events
        await record(*(EventDraft(type="step", run_id="run-old") for _ in range(500)))
    await record(EventDraft(type="child.spawned", data={"thread_id": "x"}, run_id="run-old"))
    await record(EventDraft(type="run.started", run_id="run-new"))
    spawned = [
        EventDraft(type="child.spawned", data={"thread_id": f"c{i}"}, run_id="run-new")
        for i in range(3)
    ]
    await record(*spawned, *(EventDraft(type="step", run_id="run-new") for _ in range(600)))
    found = await run_children(store, "p", "run-new")
    assert [e.data["thread_id"] for e in found] == ["c0", "c1", "c2"]
    assert store.reads == 2, "two pages back to the run's start, not the 3,600 events"


@pytest.mark.asyncio
async def test_a_relay_in_the_process_delivers_a_joined_spawn_without_waiting_its_interval(
    env: Env,
) -> None:
    from wakeful.fleet import RelayLoop

    env.add("boss", fan_out(env))
    env.worker("w1", relay=False)
    relay = RelayLoop(env.store, "relay", POLICY, env.wake, interval=3600.0, ttl=40000.0)
    stop = asyncio.Event()
    relaying = asyncio.create_task(relay.run(stop))
    try:
        await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
        done = await env.ended("p")  # an hour's interval: only the nudge delivers the spawns
        assert done.state["results"] == [2, 4, 6]
        assert relay.delivered == 3
    finally:
        stop.set()
        await asyncio.wait_for(relaying, 10)


@pytest.mark.asyncio
async def test_a_tool_spawns_a_graph_and_joins_it(env: Env) -> None:
    ran: list[int] = []

    @tool
    async def double(n: int, ctx: ToolContext) -> str:
        """Double a number in a child run."""
        ran.append(n)
        outcome = await ctx.join(await ctx.spawn("double", {"n": n}))
        return str(outcome.state["out"])

    model = Scripted.of(calls(("c1", "double", {"n": 21})), reply("It is 42."))
    env.registry.add("helper", Agent("helper", model, "Use the tool.", [double]))
    env.worker("w1")
    await submit(env.store, "chat", "helper", "Double 21.", dispatch_id="d1", wake=env.wake)
    done = await env.ended("chat")
    assert done.state["final"] == "It is 42."
    results = [m for m in await env.store.messages("chat") if m.role == "tool"]
    assert [(m.content, m.metadata["outcome"]) for m in results] == [("42", "ok")]
    assert env.calls["double-21"] == 1
    # the spawn is committed with the suspension, so the first join always waits; the call
    # runs again on resume and its join returns the answer
    assert ran == [21, 21]


@pytest.mark.asyncio
async def test_a_spawn_decided_by_an_attempt_that_lost_its_claim_is_the_same_child(
    env: Env,
) -> None:
    """The first attempt spawns, then hangs before recording anything; its lease lapses and
    another worker runs the node again: it spawns the same child, which runs once; the
    first attempt, released later, records nothing."""
    attempts: list[str] = []

    async def boss(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        child = await ctx.spawn("double", {"n": 3})
        attempts.append(child.thread_id)
        if len(attempts) == 1:
            await env.gate.wait()  # the first attempt hangs here: nothing is recorded
        return {"results": [(await ctx.join(child)).state["out"]]}

    env.add("boss", boss)
    env.worker("w1")
    await submit(env.store, "p", "boss", {}, dispatch_id="d1", wake=env.wake)
    await eventually(lambda: len(attempts) == 1)
    env.clock.advance(31)  # past the claim's ttl: the lease lapses
    env.worker("w2")
    done = await env.ended("p")
    env.gate.set()  # the first attempt goes on, and is fenced at its first commit
    await asyncio.sleep(0.2)
    assert done.state["results"] == [6]
    assert len(attempts) >= 2 and len(set(attempts)) == 1, "the same child both times"
    assert env.calls["double-3"] == 1
    events = await env.store.events_after("p", 0, 1000)
    assert [e.type for e in events].count("child.spawned") == 1
    assert [e.type for e in events].count("run.recovered") == 1
    latest = await env.latest("p")
    assert latest is not None and latest.id == done.id, "the fenced attempt recorded nothing"
