"""Every pool-backed background task stops, and sends nothing more, when its stop (or
cancellation) arrives 0 to 5 event-loop iterations after the pool handed it a connection.

The store's pool has ONE connection. The test holds it, starts the task so that its next
step waits for that connection, gives it back (the pool hands it straight to the waiting
task) and stops the task ``k`` loop iterations later. On Python 3.11 psycopg_pool's wait for
a connection swallows a cancellation arriving in that window (psycopg issue 1345): a task
stopped by cancellation alone then ran on for ever, and whoever awaited it hung (for the
renewer: the run, holding its lease). Here each stop must return within a deadline and
the task must be over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypedDict

import pytest

from tests.postgres_support import Databases, open_test_store
from tests.runtime_support import eventually
from wakeful.agent import Agent
from wakeful.agent.recovery import Accumulator, StreamPolicy, StreamRecovery
from wakeful.background import BackgroundTask
from wakeful.errors import StreamCheckpointError
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.fleet.relay import RelayLoop
from wakeful.fleet.wake import NoWake
from wakeful.providers.base import ModelRequest, StreamEnd, StreamItem, TextDelta, Usage
from wakeful.providers.scripted import Scripted
from wakeful.records import Claim, Commit, EventDraft, StreamCheckpoint
from wakeful.runtime import START, Graph
from wakeful.runtime.claims import ClaimPolicy, Renewer
from wakeful.runtime.durability import AsyncWriter
from wakeful.store.postgres import PostgresStore
from wakeful.store.postgres.notify import Notifier

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

ITERATIONS = range(6)
STOP_DEADLINE = 10.0
"""Seconds a stop may take here (a stop waits at most twice its timeout, 5 s by default;
the tests' stops end after one step, in milliseconds)."""


class Empty(TypedDict):
    done: bool


class Counted:
    """Counts calls of some store methods, and those begun after ``stopped`` was set."""

    def __init__(self, inner: Any, *names: str) -> None:
        self._inner = inner
        self._names = set(names)
        self.made = 0
        self.after_stop = 0
        self.stopped = False

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name not in self._names:
            return target
        if not asyncio.iscoroutinefunction(target):  # put_soon: answers with a future

            def soon(*args: Any, **kwargs: Any) -> Any:
                self._count()
                return target(*args, **kwargs)

            return soon

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._count()
            return await target(*args, **kwargs)

        return call

    def _count(self) -> None:
        self.made += 1
        if self.stopped:
            self.after_stop += 1


async def _handover_then_stop(
    store: PostgresStore,
    k: int,
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[Any]],
) -> None:
    pool = store._db.pool
    async with pool.connection():
        await start()
        await eventually(lambda: pool.get_stats().get("requests_waiting", 0) == 1)
    # leaving the block handed the connection to the waiting task
    for _ in range(k):
        await asyncio.sleep(0)
    stopping = asyncio.ensure_future(stop())
    done, _ = await asyncio.wait({stopping}, timeout=STOP_DEADLINE)
    assert done, f"the stop hung (it came {k} loop iterations after the handover)"
    stopping.result()


async def _fast(seconds: float) -> None:
    await asyncio.sleep(0)


async def _one_connection(pg_databases: Databases) -> PostgresStore:
    return await open_test_store(await pg_databases.clone(), pool_size=1, pool_min_size=1)


async def test_the_renewer(pg_databases: Databases) -> None:
    store = await _one_connection(pg_databases)
    try:
        for k in ITERATIONS:
            claim = await store.claim(f"t{k}", "h", 30)
            counted = Counted(store, "renew")
            renewer = Renewer(counted, f"t{k}", claim.token, ClaimPolicy(), lambda _: None, _fast)

            async def start(r: Renewer = renewer) -> None:
                r.start()

            await _handover_then_stop(store, k, start, renewer.stop)
            counted.stopped = True
            assert counted.made <= 1, "only the renewal handed the connection was sent"
            assert renewer._task is not None and not renewer._task.running
            assert counted.after_stop == 0
    finally:
        await store.close()


async def test_the_renewer_on_timers(pg_databases: Databases) -> None:
    """With the default sleep the renewer waits on event-loop timers and each renewal is
    a task of its own: the same stop guarantees, and no timer left armed."""
    store = await _one_connection(pg_databases)
    policy = ClaimPolicy(ttl=30, renew_every=0.01, stall_after=None)
    try:
        for k in ITERATIONS:
            claim = await store.claim(f"t{k}", "h", 30)
            counted = Counted(store, "renew")
            renewer = Renewer(counted, f"t{k}", claim.token, policy, lambda _: None)

            async def start(r: Renewer = renewer) -> None:
                r.start()

            await _handover_then_stop(store, k, start, renewer.stop)
            counted.stopped = True
            assert counted.made == 1, "only the renewal handed the connection was sent"
            assert renewer._task is not None and not renewer._task.running
            assert renewer._timer is None and counted.after_stop == 0
            await asyncio.sleep(0.05)  # five periods: nothing more is sent
            assert counted.after_stop == 0 and renewer.renewals <= 1
    finally:
        await store.close()


async def test_the_async_writer(pg_databases: Databases) -> None:
    store = await _one_connection(pg_databases)
    try:
        for k in ITERATIONS:
            claim = await store.claim(f"t{k}", "h", 30)
            counted = Counted(store, "commit")
            writer = AsyncWriter(counted, f"t{k}")

            async def start(w: AsyncWriter = writer, c: Claim = claim) -> None:
                await w.submit(Commit(token=c.token, events=(EventDraft(type="x"),)))

            await _handover_then_stop(store, k, start, writer.close)
            counted.stopped = True
            assert counted.made == 1 and not writer._task.running and counted.after_stop == 0
    finally:
        await store.close()


async def test_the_stream_checkpoint_saver(pg_databases: Databases) -> None:
    store = await _one_connection(pg_databases)
    try:
        for k in ITERATIONS:
            claim = await store.claim(f"t{k}", "h", 30)
            counted = Counted(store.stream_checkpoints, "put", "put_soon")
            recovery = StreamRecovery(
                provider=Scripted([]),
                policy=StreamPolicy(),
                run_id=f"run-{k}",
                thread_id=f"t{k}",
                task_id="s0-t0",
                token=claim.token,
                checkpoints=counted,
            )
            acc = Accumulator(text="partial")

            async def start(r: StreamRecovery = recovery, a: Accumulator = acc) -> None:
                r._save_in_background(a, 0)
                pool = store._db.pool
                await eventually(lambda: pool.get_stats().get("requests_waiting", 0) == 1)
                a.text += " and more"
                r._save_in_background(a, 0)  # waits its turn: written, then the chain ends

            await _handover_then_stop(store, k, start, recovery._drain_saves)
            counted.stopped = True
            saves = recovery._saves
            assert saves is not None and saves._flight is None and saves._next is None
            assert counted.made == 2 and counted.after_stop == 0
            saved = await store.stream_checkpoints.get(f"run-{k}")
            assert isinstance(saved, StreamCheckpoint) and saved.partial_text == "partial and more"
    finally:
        await store.close()


async def test_the_notifier(pg_databases: Databases) -> None:
    for k in ITERATIONS:
        store = await _one_connection(pg_databases)
        notifier = store.notifier
        try:

            async def start(n: Notifier = notifier) -> None:
                n.notify("t1")

            await _handover_then_stop(store, k, start, notifier.close)
            assert notifier.rounds <= 1 and notifier._task is None
            notifier.notify("t2")
            assert notifier.pending == 0, "closed: nothing more is sent"
        finally:
            await store.close()


async def test_the_relay_and_sweeper(pg_databases: Databases) -> None:
    store = await _one_connection(pg_databases)
    try:
        for k in ITERATIONS:
            counted = Counted(store, "claim", "renew", "relay_outbox", "prune", "release")
            relay = RelayLoop(counted, f"relay-{k}", ClaimPolicy(), NoWake(), interval=0.01)
            task = BackgroundTask(f"relay-{k}", relay.run)

            async def start(t: BackgroundTask = task) -> None:
                t.start()

            await _handover_then_stop(store, k, start, task.stop)
            counted.stopped = True
            assert not task.running and counted.after_stop == 0
    finally:
        await store.close()


async def test_the_worker_heartbeat(pg_databases: Databases) -> None:
    store = await _one_connection(pg_databases)
    try:
        for k in ITERATIONS:
            counted = Counted(store, "heartbeat")
            worker = Worker(
                counted,
                Registry(),
                claims=ClaimPolicy(ttl=0.15, renew_every=0.05),
                worker_id=f"w{k}",
            )
            worker.identity = await store.register_worker(f"w{k}")
            task = BackgroundTask(f"heartbeat-{k}", worker._heartbeat)

            async def start(t: BackgroundTask = task) -> None:
                t.start()

            await _handover_then_stop(store, k, start, task.stop)
            counted.stopped = True
            assert counted.made == 1 and not task.running and counted.after_stop == 0
    finally:
        await store.close()


class PacedReply:
    """Streams ``text`` as ``deltas`` text deltas spread over ``seconds``, to every request."""

    model = "paced"

    def __init__(self, text: str, deltas: int, seconds: float) -> None:
        self.text = text
        self.deltas = deltas
        self.seconds = seconds

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._play()

    async def _play(self) -> AsyncIterator[StreamItem]:
        size = len(self.text) // self.deltas
        for i in range(self.deltas):
            await asyncio.sleep(self.seconds / self.deltas)
            yield TextDelta(self.text[i * size : (i + 1) * size])
        yield StreamEnd("end_turn", Usage(1, self.deltas))


@pytest.mark.slow
async def test_many_streaming_runs_through_one_worker_end_exactly_once(
    pg_databases: Databases,
) -> None:
    """The issue's experiment, smaller: one worker, ``RUNS`` runs each streaming a reply of
    150 deltas, renewals and stream checkpoints competing for a small pool. Every run ends
    exactly once and nothing is left behind (the renewer once hung runs here)."""
    runs, reply = 100, "abcd" * 150
    store = await open_test_store(await pg_databases.clone(), pool_size=4, pool_timeout=30.0)
    agent = Agent("paced", PacedReply(reply, 150, 1.5))
    registry = Registry(default="paced").add("paced", agent)
    wake = LocalWake()
    worker = Worker(
        store,
        registry,
        concurrency=runs,
        claims=ClaimPolicy(ttl=5, renew_every=0.1),
        wake=wake,
        poll_interval=0.1,
        relay=False,
    )
    running = asyncio.create_task(worker.run())
    try:
        for i in range(runs):
            await submit(store, f"t{i}", "paced", "go", dispatch_id=f"d{i}")
        await wake.notify()

        async def stuck() -> int:
            rows = await store.list_dispatches(status="leased", limit=1000)
            pending = await store.list_dispatches(status="pending", limit=1000)
            return len(rows) + len(pending)

        await eventually(lambda: _all_ended(worker, runs), deadline=100)
        assert await stuck() == 0
    finally:
        await worker.stop(grace=5)
        await asyncio.wait_for(running, 30)
    try:
        for i in range(runs):
            events = [e.type for e in await store.events_after(f"t{i}", 0)]
            assert events.count("run.completed") == 1 and "run.stalled" not in events
            messages = await store.messages(f"t{i}", 0, 10)
            assert [m.role for m in messages] == ["user", "assistant"]
            assert messages[1].content == reply
            assert await store.stream_checkpoints.get(f"run-d{i}") is None
        assert worker.stats.done == runs and worker.stats.fenced == 0
        assert worker.metrics.stalled_runs.value() == 0
    finally:
        await store.close()


def _all_ended(worker: Worker, runs: int) -> bool:
    return worker.stats.done == runs and worker.busy == 0


async def test_stream_checkpoint_puts_are_grouped_and_fenced_one_by_one(
    pg_databases: Databases,
) -> None:
    store = await open_test_store(await pg_databases.clone(), pool_size=4)
    try:
        claims = [await store.claim(f"t{i}", "h", 30) for i in range(50)]
        puts = [
            store.stream_checkpoints.put(
                StreamCheckpoint(
                    run_id=f"run-{i}",
                    thread_id=f"t{i}",
                    model="m",
                    partial_text=f"text {i}",
                    token=claim.token + (1 if i == 7 else 0),  # t7's put is stale
                    task_id="s0-t0",
                )
            )
            for i, claim in enumerate(claims)
        ]
        results = await asyncio.gather(*puts, return_exceptions=True)
        refused = [i for i, r in enumerate(results) if isinstance(r, StreamCheckpointError)]
        assert refused == [7] and all(r is None for i, r in enumerate(results) if i != 7)
        assert store.stream_checkpoints.statements <= 2, "50 puts in one or two statements"
        for i in range(50):
            saved = await store.stream_checkpoints.get(f"run-{i}")
            assert (saved is None) if i == 7 else (saved and saved.partial_text == f"text {i}")
    finally:
        await store.close()
    with pytest.raises(StreamCheckpointError):
        await store.stream_checkpoints.put(
            StreamCheckpoint(run_id="run-x", thread_id="t0", model="m", token=1, task_id="a")
        )


async def test_a_put_batch_locks_its_threads_in_thread_id_order(
    pg_databases: Databases,
) -> None:
    """Each put's fencing check locks its thread row; grouped renewals and commits lock
    theirs in thread id order, so a put batch must too, or the two deadlock (seen at
    N = 1,000 once renewals and saves fell on the same slots: a second per deadlock)."""
    store = await open_test_store(await pg_databases.clone(), pool_size=4)
    sent: list[list[str]] = []
    db: Any = store.stream_checkpoints._db
    fetchall = db.fetchall

    async def recording(query: str, params: Any = None, **kwargs: Any) -> Any:
        if "put_stream_checkpoint" in query:
            sent.append(list(params[1]))
        return await fetchall(query, params, **kwargs)

    db.fetchall = recording
    try:
        claims = {i: await store.claim(f"t{i:02d}", "h", 30) for i in range(40)}
        await asyncio.gather(
            *(
                store.stream_checkpoints.put(
                    StreamCheckpoint(
                        run_id=f"run-{i}",
                        thread_id=f"t{i:02d}",
                        model="m",
                        token=claims[i].token,
                        task_id="s0-t0",
                    )
                )
                for i in reversed(range(40))  # queued in descending thread order
            )
        )
        assert sum(len(b) for b in sent) == 40 and len(sent) <= 2, sent
        assert all(batch == sorted(batch) for batch in sent), sent
    finally:
        db.fetchall = fetchall
        await store.close()


@pytest.mark.slow
async def test_a_worker_with_more_slots_than_one_claim_takes_fills_them(
    pg_databases: Databases,
) -> None:
    """PostgreSQL's ``claim_next`` takes at most 1,000 dispatches per call: a worker with
    concurrency 1,001 once asked for all of them at once, was refused, and never ran
    anything."""
    store = await open_test_store(await pg_databases.clone(), pool_size=4)
    gate = asyncio.Event()
    entered: list[int] = []

    async def node(state: dict[str, Any]) -> dict[str, Any]:
        entered.append(1)
        await gate.wait()
        return {}

    graph = Graph(Empty, name="gated").node("n", node).edge(START, "n").compile()
    n = 1001
    for i in range(n):
        await submit(store, f"t{i}", "gated", {}, dispatch_id=f"d{i}")
    worker = Worker(store, Registry().add("gated", graph), concurrency=n, poll_interval=0.1)
    running = asyncio.create_task(worker.run())
    try:
        await eventually(lambda: len(entered) == n, deadline=60)
        gate.set()
        await eventually(lambda: worker.stats.done == n, deadline=60)
    finally:
        gate.set()
        await worker.stop(grace=5)
        await asyncio.wait_for(running, 30)
        await store.close()
