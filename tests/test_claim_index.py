"""The memory and file stores keep their claimable dispatches in claim order
(``State.claimable``) instead of sorting the queue on every ``claim_next``: the index must
always equal what sorting would give, through every queue mutation and a snapshot reload."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from wakeful.clock import ManualClock
from wakeful.errors import WakefulError
from wakeful.records import Dispatch, Done, Outcome, Retry
from wakeful.store.file import open_file_store
from wakeful.store.memory import MemoryStore
from wakeful.store.projected import ProjectedStore
from wakeful.store.projection import CLAIMABLE, State


def expected_index(state: State) -> list[tuple[int, float, int, str]]:
    return sorted(
        (-d.priority, d.fair_tag, state.dispatch_order[d.dispatch_id], d.dispatch_id)
        for d in state.dispatches.values()
        if d.status in CLAIMABLE
    )


async def churn(store: ProjectedStore, clock: ManualClock, rng: random.Random, steps: int) -> None:
    """Random queue operations; after each, the index equals the sorted queue."""
    state = store._state
    for step in range(steps):
        op = rng.choice(["enqueue", "enqueue", "claim", "settle", "cancel", "operator", "time"])
        try:
            if op == "enqueue":
                await store.enqueue(
                    Dispatch(
                        dispatch_id=f"d{step}",
                        thread_id=f"t{rng.randrange(6)}",
                        kind="start",
                        payload={"step": step},
                        priority=rng.choice([0, 0, 1, 5]),
                        max_attempts=2,
                    )
                )
            elif op == "claim":
                await store.claim_next("w", 10, limit=rng.randrange(1, 4))
            elif op == "settle":
                leased = [d for d in state.dispatches.values() if d.status == "leased"]
                if leased:
                    d = rng.choice(leased)
                    assert d.token is not None
                    outcome: Outcome = Done()
                    if rng.random() < 0.5:
                        outcome = Retry(rng.choice([0.0, 30.0]), "again")
                    await store.settle(d.dispatch_id, d.token, outcome)
            elif op == "cancel":
                await store.cancel(f"t{rng.randrange(6)}", "stop")
            elif op == "operator":
                ids = list(state.dispatches)
                if ids:
                    did = rng.choice(ids)
                    action = rng.choice([store.quarantine, store.requeue, store.purge])
                    await action(did)
            else:
                clock.advance(rng.choice([1, 11, 40]))
        except WakefulError:
            pass  # a refused operation changes nothing; the index must still agree
        assert state.claimable == expected_index(state), (step, op)


@pytest.mark.asyncio
async def test_the_claim_index_follows_every_queue_mutation() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    await churn(store, clock, random.Random(7), 600)
    assert store._state.claimable, "the churn left nothing claimable: it tested little"


@pytest.mark.asyncio
async def test_the_claim_index_is_rebuilt_from_a_snapshot_and_the_log(tmp_path: Path) -> None:
    clock = ManualClock()
    root = tmp_path / "store"
    store = await open_file_store(root.as_uri(), clock=clock)
    await churn(store, clock, random.Random(11), 200)
    await store.compact()  # a snapshot of the state so far
    await churn(store, clock, random.Random(12), 100)  # and a log after it
    index = list(store._state.claimable)
    await store.close()
    reopened = await open_file_store(root.as_uri(), clock=clock)
    try:
        assert reopened._state.claimable == index == expected_index(reopened._state)
        leases = await reopened.claim_next("w2", 10, limit=3)
        order = [(-x.dispatch.priority, x.dispatch.dispatch_id) for x in leases]
        assert order == sorted(order, key=lambda k: (k[0], reopened._state.dispatch_order[k[1]]))
    finally:
        await reopened.close()
