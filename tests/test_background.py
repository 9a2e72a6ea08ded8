"""Background tasks stop on their own signal, in bounded time, whatever happens to a
cancellation; a run's claim is renewed only while the run shows life (``stall_after``); and
a chaos trial of delayed, cancelled and swallowed-cancel renewals, in which no renewal
outlives its run and every dispatch ends."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from typing import Annotated, Any, TypedDict

import pytest

from tests.runtime_support import GatedSleep, eventually
from wakeful import ManualClock
from wakeful.background import BackgroundTask, StopSignal
from wakeful.errors import CheckpointWriteFailed, RunStalled
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.metrics import Metrics
from wakeful.records import Claim, Commit
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, Runtime, append
from wakeful.runtime.claims import RENEW_SLOTS, Renewer
from wakeful.store.memory import MemoryStore

pytestmark = pytest.mark.asyncio


class State(TypedDict):
    log: Annotated[list[str], append]


# ------------------------------------------------------------------ the helper


async def test_a_loop_that_swallows_its_cancellation_still_stops_on_its_signal() -> None:
    steps: list[int] = []

    async def body(signal: StopSignal) -> None:
        while not signal.is_set():
            # a step that a cancellation cannot end, as asyncio.wait_for's on Python 3.11
            # can be (psycopg issue 1345)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.2)
            steps.append(1)

    task = BackgroundTask("swallower", body, stop_timeout=0.05)
    task.start()
    await asyncio.sleep(0)
    assert await task.stop() is True, "it ended after its current step, by the signal"
    assert not task.running and not task.abandoned and len(steps) == 1


async def test_a_pause_ends_at_the_signal_and_a_stop_does_not_wait_for_the_interval() -> None:
    ticks: list[int] = []

    async def body(signal: StopSignal) -> None:
        while not await signal.pause(3600):
            ticks.append(1)

    task = BackgroundTask("sleeper", body, stop_timeout=60)
    task.start()
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(task.stop())
    done, _ = await asyncio.wait({stopping}, timeout=5)
    assert done and stopping.result() is True and ticks == []


async def test_an_idle_loop_is_woken_for_work_and_ends_at_the_signal() -> None:
    work: list[int] = []
    done: list[int] = []

    async def body(signal: StopSignal) -> None:
        while True:
            done.extend(work)
            work.clear()
            if await signal.idle() and not work:
                return

    task = BackgroundTask("consumer", body, stop_timeout=60)
    task.start()
    await asyncio.sleep(0)
    for i in range(3):
        work.append(i)
        task.signal.wake()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert done == list(range(i + 1)) and task.running, "woken, not stopped"
    work.append(3)  # queued right before the stop: still done, then the loop ends
    stopping = asyncio.ensure_future(task.stop())
    finished, _ = await asyncio.wait({stopping}, timeout=5)
    assert finished and stopping.result() is True and done == [0, 1, 2, 3]
    waiting = asyncio.ensure_future(task.signal.wait())  # set: returns at once
    assert (await asyncio.wait({waiting}, timeout=5))[0]


async def test_a_pause_through_a_controllable_sleep_ends_at_the_signal() -> None:
    sleep = GatedSleep()
    signal = StopSignal()
    pausing = asyncio.ensure_future(signal.pause(10, sleep))
    await eventually(lambda: sleep.pending == 1)
    signal.set()
    assert await asyncio.wait_for(pausing, 5) is True
    assert sleep.pending == 0, "the sleep was cancelled, not left behind"
    again = asyncio.ensure_future(StopSignal().pause(10, sleep))
    await eventually(lambda: sleep.pending == 1)
    sleep.release_all()
    assert await asyncio.wait_for(again, 5) is False


async def test_a_task_that_never_ends_is_abandoned_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def body(signal: StopSignal) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # deaf to cancellation and to its signal

    task = BackgroundTask("deaf", body, stop_timeout=0.05)
    task.start()
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="wakeful.background"):
        assert await task.stop() is False
    assert task.abandoned and task.running
    warnings = [r for r in caplog.records if "deaf" in r.getMessage()]
    assert len(warnings) == 1 and "abandoning" in warnings[0].getMessage()
    release.set()
    await eventually(lambda: not task.running)


async def test_a_failing_body_is_logged_and_stop_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body(signal: StopSignal) -> None:
        raise RuntimeError("boom")

    task = BackgroundTask("failing", body)
    with caplog.at_level(logging.ERROR, logger="wakeful.background"):
        task.start()
        await eventually(lambda: not task.running)
        assert await task.stop() is True
    assert any("failing" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ progress-gated renewal


class _CountingRenewals(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.renewed: list[int] = []

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        self.renewed.append(token)
        return await super().renew(thread_id, token, ttl)


async def test_a_renewer_makes_no_task_before_its_first_interval_and_renews_after_it() -> None:
    store = _CountingRenewals()
    claim = await store.claim("t1", "h", 30)
    policy = ClaimPolicy(ttl=30, renew_every=0.04)
    short = Renewer(store, "t1", claim.token, policy, lambda _: None)
    before = len(asyncio.all_tasks())
    short.start()
    assert len(asyncio.all_tasks()) == before, "a timer, not a task, until the first interval"
    await short.stop()  # a run that ended within its first interval
    await asyncio.sleep(0.1)
    assert store.renewed == [] and len(asyncio.all_tasks()) == before, "the timer was cancelled"
    long = Renewer(store, "t1", claim.token, policy, lambda _: None)
    long.start()
    await eventually(lambda: long.renewals >= 2)
    await long.stop()
    stopped = len(store.renewed)
    await asyncio.sleep(0.1)
    assert len(store.renewed) == stopped, "no renewal after stop()"


async def test_renewals_due_within_one_slot_fire_together_still_spread_over_the_period() -> None:
    """Renewal timers sit on a grid of ``RENEW_SLOTS`` slots a period: runs started together
    renew in a few groups (one grouped store statement each), not one by one, and their
    first renewals still spread over the second half of the period."""
    store = _CountingRenewals()
    policy = ClaimPolicy(ttl=300, renew_every=100)  # nothing fires during the test
    grid = policy.renew_every / RENEW_SLOTS
    loop = asyncio.get_running_loop()
    renewers = []
    for i in range(200):
        claim = await store.claim(f"t{i}", "h", 300)
        renewer = Renewer(store, f"t{i}", claim.token, policy, lambda _: None)
        renewers.append(renewer)
    now = loop.time()
    for renewer in renewers:
        renewer.start()
    whens = [r._timer.when() for r in renewers if r._timer is not None]
    assert len(whens) == 200
    for when in whens:
        assert now + 0.5 * policy.renew_every <= when <= loop.time() + policy.renew_every + grid
        assert abs(when / grid - round(when / grid)) < 1e-6, "on the grid"
    slots = len(set(whens))
    assert 10 <= slots <= RENEW_SLOTS // 2 + 1, slots
    timers = {id(r._timer) for r in renewers}
    assert len(timers) == slots, "the renewers due at one instant share its one timer"
    for renewer in renewers:
        await renewer.stop()
    assert all(r._timer is None for r in renewers) and store.renewed == []


def _graph(node: Any) -> Any:
    g = Graph(State, name="stall")
    g.node("slow", node)
    g.edge(START, "slow")
    return g.compile()


async def test_a_run_that_shows_no_life_stops_being_renewed_and_is_taken_over() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    policy = ClaimPolicy(ttl=30, renew_every=10, stall_after=20)
    metrics = Metrics()
    sleep = GatedSleep()
    stuck = asyncio.Event()
    entered: list[int] = []

    async def node(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        entered.append(1)
        if len(entered) == 1:
            await stuck.wait()  # hangs, not declared as waiting
        return {"log": ["slow"]}

    runtime = Runtime(store, policy, clock, holder="rt-1", renew_sleep=sleep, metrics=metrics)
    handle = await runtime.start("t1", _graph(node))
    await eventually(lambda: entered == [1] and sleep.pending == 1)
    for renewed in (1, 2):  # the first interval after the start, then 10 s without progress
        sleep.release_all()
        await eventually(lambda r=renewed: handle.renewals == r and sleep.pending == 1)
    sleep.release_all()  # 20 s without progress: stalled
    with pytest.raises(CheckpointWriteFailed) as failed:
        await asyncio.wait_for(handle.result(), 10)
    assert isinstance(failed.value.cause, RunStalled)
    assert handle.renewals == 2 and sleep.pending == 0, "no renewal after the stall"
    assert metrics.stalled_runs.value() == 1
    events = await store.events_after("t1", 0)
    assert [e.type for e in events] == ["run.started", "run.stalled"]
    assert events[-1].data == {"idle_seconds": 20.0}
    snap = await store.read("t1")
    assert snap is not None and snap.claim is not None, "the claim is left to expire"
    assert snap.checkpoint is not None and snap.checkpoint.status == "running"

    clock.advance(31)  # the claim expired: another runtime takes the run over
    other = Runtime(store, policy, clock, holder="rt-2", renew_sleep=GatedSleep())
    recovered = await other.recover("t1", _graph(node))
    outcome = await asyncio.wait_for(recovered.result(), 10)
    assert outcome.status == "completed" and outcome.state == {"log": ["slow"]}
    stuck.set()


async def test_a_run_known_to_be_waiting_keeps_its_claim_however_long() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    policy = ClaimPolicy(ttl=30, renew_every=10, stall_after=20)
    sleep = GatedSleep()
    answer = asyncio.Event()

    async def node(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        with ctx.waiting():
            await answer.wait()
        return {"log": ["slow"]}

    runtime = Runtime(store, policy, clock, renew_sleep=sleep)
    handle = await runtime.start("t1", _graph(node))
    for round_ in range(6):
        await eventually(lambda: sleep.pending == 1)
        sleep.release_all()
        await eventually(lambda r=round_: handle.renewals == r + 1)
    answer.set()
    assert (await asyncio.wait_for(handle.result(), 10)).status == "completed"


async def test_progress_reported_by_a_node_keeps_its_claim() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    policy = ClaimPolicy(ttl=30, renew_every=10, stall_after=10)
    sleep = GatedSleep()
    step = asyncio.Event()
    done = asyncio.Event()

    async def node(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        while not done.is_set():
            await step.wait()
            step.clear()
            ctx.report_progress()
        return {"log": ["slow"]}

    runtime = Runtime(store, policy, clock, renew_sleep=sleep)
    handle = await runtime.start("t1", _graph(node))
    for round_ in range(4):
        await eventually(lambda: sleep.pending == 1)
        step.set()
        await eventually(lambda: not step.is_set())
        sleep.release_all()
        await eventually(lambda r=round_: handle.renewals == r + 1)
    done.set()
    step.set()
    assert (await asyncio.wait_for(handle.result(), 10)).status == "completed"


async def test_a_worker_gives_up_a_stalled_run_and_a_worker_finishes_it() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    wake = LocalWake()
    stuck = asyncio.Event()
    attempts: list[int] = []

    async def node(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        attempts.append(1)
        if len(attempts) == 1:
            await stuck.wait()
        return {"log": ["slow"]}

    registry = Registry(default="stall")
    registry.add("stall", _graph(node))
    worker = Worker(
        store,
        registry,
        claims=ClaimPolicy(ttl=30, renew_every=0.02, stall_after=0.05),
        wake=wake,
        poll_interval=0.02,
        clock=clock,
    )
    running = asyncio.create_task(worker.run())
    try:
        await submit(store, "t1", "stall", {"log": []}, dispatch_id="d1", wake=wake)
        await eventually(lambda: worker.metrics.stalled_runs.value() == 1)
        await eventually(lambda: worker.busy == 0)  # the stalled run's slot is free again
        d = await store.get_dispatch("d1")
        assert d is not None and d.status == "leased", "not settled: the lease expires"
        clock.advance(31)
        await wake.notify()
        await eventually(lambda: _done(store, "d1"))
        assert len(attempts) == 2
        events = [e.type for e in await store.events_after("t1", 0)]
        assert events.count("run.stalled") == 1 and events[-1] == "run.completed"
    finally:
        stuck.set()
        await worker.stop(grace=5)
        await asyncio.wait_for(running, 10)


async def _done(store: MemoryStore, dispatch_id: str) -> bool:
    d = await store.get_dispatch(dispatch_id)
    return d is not None and d.status == "done"


# ------------------------------------------------------------------ chaos


class ChaoticRenewals:
    """A store whose renewals are delayed at random; a cancellation that arrives during
    the delay is swallowed and the renewal goes on, as psycopg_pool's wait for a connection
    does when the cancellation comes just as it is handed one. Records when each renewal
    started and ended and when each thread's claim-ending commit started, on one counter."""

    def __init__(self, inner: MemoryStore, rng: random.Random) -> None:
        self._inner = inner
        self._rng = rng
        self._ticks = itertools.count()
        self.renewals: dict[str, list[tuple[int, int]]] = {}
        self.ended: dict[str, int] = {}
        self.swallowed = 0
        self.inflight: set[asyncio.Task[Any]] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        started = next(self._ticks)
        task = asyncio.current_task()
        assert task is not None
        self.inflight.add(task)
        try:
            await asyncio.sleep(self._rng.choice((0.0, self._rng.uniform(0.005, 0.04))))
        except asyncio.CancelledError:
            self.swallowed += 1
        finally:
            self.inflight.discard(task)
        claim = await self._inner.renew(thread_id, token, ttl)
        self.renewals.setdefault(thread_id, []).append((started, next(self._ticks)))
        return claim

    async def commit(self, thread_id: str, commit: Commit) -> Any:
        if commit.settle is not None or commit.release:
            self.ended.setdefault(thread_id, next(self._ticks))
        return await self._inner.commit(thread_id, commit)


async def test_chaos_no_renewal_outlives_its_run_and_every_dispatch_ends() -> None:
    rng = random.Random(24)
    clock = ManualClock()
    store = ChaoticRenewals(MemoryStore(clock), rng)
    wake = LocalWake()

    async def step(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        await asyncio.sleep(rng.uniform(0, 0.1))
        return {"log": [ctx.node]}

    g = Graph(State, name="chaos")
    g.node("a", step).node("b", step)
    g.edge(START, "a").edge("a", "b")
    registry = Registry(default="chaos")
    registry.add("chaos", g.compile())
    # a stop waits 0.03 s, cancels, waits 0.03 s more: longer than any delay, so nothing
    # is abandoned and every renewal must have ended before its run's ending commit
    policy = ClaimPolicy(ttl=30, renew_every=0.01, stop_timeout=0.03)
    worker = Worker(
        store,
        registry,
        concurrency=8,
        claims=policy,
        wake=wake,
        poll_interval=0.02,
        clock=clock,
        relay=False,
    )

    async def monkey() -> None:
        """Cancels renewals in flight at random moments (as a stop's cancellation would)."""
        while True:
            await asyncio.sleep(rng.uniform(0, 0.005))
            if store.inflight and rng.random() < 0.3:
                rng.choice(sorted(store.inflight, key=id)).cancel()

    running = asyncio.create_task(worker.run())
    chaos = asyncio.create_task(monkey())
    runs = 60
    try:
        for i in range(runs):
            await submit(store, f"t{i}", "chaos", {"log": []}, dispatch_id=f"d{i}", wake=wake)
        await eventually(lambda: all_done(store, runs), deadline=30)  # every dispatch ends
    finally:
        chaos.cancel()
        await worker.stop(grace=5)
        await asyncio.wait_for(running, 10)
    for i in range(runs):
        snap = await store.read(f"t{i}")
        assert snap is not None and snap.checkpoint is not None
        assert snap.checkpoint.status == "completed"
        ended = store.ended[f"t{i}"]
        late = [r for r in store.renewals.get(f"t{i}", []) if r[1] > ended]
        assert late == [], f"a renewal of t{i} outlived its run"
    assert sum(len(v) for v in store.renewals.values()) > runs
    assert store.swallowed > 0, "the chaos happened"


async def all_done(store: ChaoticRenewals, runs: int) -> bool:
    for i in range(runs):
        d = await store.get_dispatch(f"d{i}")
        if d is None or d.status != "done":
            return False
    return True
