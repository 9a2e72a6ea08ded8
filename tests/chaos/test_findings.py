"""Violations the chaos matrix found in wakeful itself, kept as in-process regression tests.

**Exhausted redelivery of a finished run recorded a second terminal event** (invariant 2,
every store; found as worker_kill/postgres seed 39978448, worker_stop/postgres seeds 73532906
and 73532909, worker_stop/sqlite seeds 56755691, 57875711 and 57875714; fixed in 0406d84).
``Worker._execute`` handled ``lease.exhausted`` before it looked at whether the dispatch's
run had already ended: when a worker died after its run's terminal commit but before the
settle, and the redelivery was past ``max_attempts``, the new claimant committed
``run.indeterminate`` for a run that was already ``completed``, or a second
``run.indeterminate`` when the dead worker had itself been the exhausted claimant."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Annotated, TypedDict

import pytest

from wakeful import ManualClock
from wakeful.errors import RunYielded
from wakeful.fleet import Registry, Worker, submit
from wakeful.records import Commit, Dispatch, Outcome, Receipt
from wakeful.runtime import START, ClaimPolicy, CompiledGraph, Graph, RunHandle, Runtime, append
from wakeful.store.memory import MemoryStore


class State(TypedDict):
    log: Annotated[list[str], append]


def graph() -> CompiledGraph:
    return Graph(State, name="g").node("n", lambda s: {"log": ["n"]}).edge(START, "n").compile()


class SettleDies(MemoryStore):
    """The worker dies at its first settle: a separate ``settle`` never happens (it died
    after committing, before settling); a settle folded into a commit is applied with the
    commit and the worker dies before it learns so (decision 0004)."""

    died = False

    async def settle(self, dispatch_id: str, token: int, outcome: Outcome) -> Dispatch:
        if not self.died:
            self.died = True
            raise RuntimeError("the worker died here")
        return await super().settle(dispatch_id, token, outcome)

    async def commit(self, thread_id: str, commit: Commit) -> Receipt:
        receipt = await super().commit(thread_id, commit)
        if commit.settle is not None and not self.died:
            self.died = True
            raise RuntimeError("the worker died here, after its settling commit")
        return receipt


async def work(store: MemoryStore, clock: ManualClock, until: str) -> None:
    """A fresh worker (a replacement) runs until the dispatch is settled (``done``) or, with
    ``until="died"``, until its settle "died"."""
    registry = Registry().add("g", graph())
    worker = Worker(store, registry, clock=clock, relay=False, poll_interval=0.01)
    running = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 10

    async def reached() -> bool:
        if until == "died":
            return isinstance(store, SettleDies) and store.died
        d = await store.get_dispatch("d")
        return d is not None and d.status == "done"

    while not await reached():
        assert time.monotonic() < deadline, f"the worker never reached {until!r}"
        await asyncio.sleep(0.01)
    await worker.stop(1)
    await running


async def terminal_events(store: MemoryStore) -> list[str]:
    ends = ("run.completed", "run.failed", "run.cancelled", "run.indeterminate")
    return [e.type for e in await store.events_after("t") if e.type in ends]


async def leased_run(store: MemoryStore, clock: ManualClock) -> RunHandle:
    """Dispatch ``d`` (one attempt allowed), leased by worker 1, its run started."""
    await submit(store, "t", "g", {}, dispatch_id="d", max_attempts=1)
    [lease] = await store.claim_next("w1", 1.0)
    runtime = Runtime(store, ClaimPolicy(ttl=1.0, renew_every=0.25), clock, holder="w1")
    return await runtime.start("t", graph(), {"log": []}, run_id="run-d", claim=lease.claim)


@pytest.mark.asyncio
async def test_a_completed_run_is_not_marked_indeterminate_by_an_exhausted_redelivery() -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    store = MemoryStore(clock)
    handle = await leased_run(store, clock)
    assert (await handle.result()).status == "completed"
    clock.advance(5)  # worker 1 died before settling; its lease expires
    await work(store, clock, "done")  # attempt 2 of 1: exhausted
    assert await terminal_events(store) == ["run.completed"]


@pytest.mark.asyncio
async def test_an_exhausted_run_is_marked_indeterminate_once() -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    store = SettleDies(clock)
    handle = await leased_run(store, clock)
    handle.yield_run()  # the run is left running, as if its worker died mid-run
    with pytest.raises(RunYielded):
        await handle.result()
    clock.advance(5)
    await work(store, clock, "died")  # exhausted: commits run.indeterminate, dies unsettled
    clock.advance(60)
    await work(store, clock, "done")
    assert await terminal_events(store) == ["run.indeterminate"]


@pytest.mark.asyncio
async def test_an_exhausted_dispatch_that_never_ran_is_marked_once() -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    store = SettleDies(clock)
    await submit(store, "t", "g", {}, dispatch_id="d", max_attempts=1)
    await store.claim_next("w1", 1.0)  # worker 1 dies before admitting the run
    clock.advance(5)
    await work(store, clock, "died")  # exhausted, no run: only an event, then dies unsettled
    clock.advance(60)
    await work(store, clock, "done")
    assert await terminal_events(store) == ["run.indeterminate"]
