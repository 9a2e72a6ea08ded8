"""Conformance cases: the dispatch queue and the worker registry."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from wakeful.errors import (
    DispatchConflict,
    InvalidState,
    NotFound,
    StaleClaim,
    ThreadBusy,
    WorkerSuperseded,
)
from wakeful.records import (
    Awaiting,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    Lease,
    PendingWrite,
    Retry,
    WorkerIdentity,
)
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


async def _lease_one(kit: Kit, holder: str = "worker-a", ttl: float = 30) -> Lease:
    leases = await kit.store.claim_next(holder, ttl)
    assert len(leases) == 1, leases
    return leases[0]


class QueueCases(Harness):
    @case
    async def test_a_lease_carries_its_thread_as_read_after_the_grant(self, kit: Kit) -> None:
        claim, first = await kit.started("t1")
        assert first.checkpoint_id is not None
        write = PendingWrite(checkpoint_id=first.checkpoint_id, task_id="a", node="n", value=1)
        await kit.store.commit("t1", Commit(token=claim.token, writes=(write,)))
        await kit.store.release("t1", claim.token)
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-old"))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-new"))
        leases = await kit.store.claim_next("worker-a", 30, limit=2)
        assert [x.dispatch.dispatch_id for x in leases] == ["d-old", "d-new"]
        for lease in leases:
            assert lease.snapshot is not None
            assert lease.snapshot == await kit.store.read(lease.dispatch.thread_id)
            assert lease.snapshot.claim == lease.claim
        old = leases[0].snapshot
        assert old is not None and old.version == 2 and old.writes == (write,)
        assert old.checkpoint is not None and old.checkpoint.id == first.checkpoint_id
        new = leases[1].snapshot
        assert new is not None and new.version == 0 and new.checkpoint is None

    @case
    async def test_enqueue_and_list(self, kit: Kit) -> None:
        first = await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1", payload={"a": 1}))
        assert first.status == "pending" and first.attempts == 0 and first.token is None
        assert first.created_at is not None and first.available_at is not None
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-2"))
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-3", kind="resume"))
        assert await kit.store.get_dispatch("d-1") == first
        assert await kit.store.get_dispatch("d-missing") is None
        assert [d.dispatch_id for d in await kit.store.list_dispatches()] == ["d-1", "d-2", "d-3"]
        by_thread = await kit.store.list_dispatches(thread_id="t1")
        assert [d.dispatch_id for d in by_thread] == ["d-1", "d-3"]
        paged = await kit.store.list_dispatches(after="d-1", limit=1)
        assert [d.dispatch_id for d in paged] == ["d-2"]
        assert await kit.store.list_dispatches(status="leased") == []

    @case
    async def test_claim_order_is_priority_then_age(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="low", priority=0))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="high", priority=5))
        await kit.store.enqueue(kit.dispatch("t3", dispatch_id="low-2", priority=0))
        await kit.store.enqueue(kit.dispatch("t4", dispatch_id="mid", priority=1))
        order = [(await _lease_one(kit)).dispatch.dispatch_id for _ in range(4)]
        assert order == ["high", "mid", "low", "low-2"]
        assert await kit.store.claim_next("worker-a", 30) == []

    @case
    async def test_fifo_within_a_priority(self, kit: Kit) -> None:
        ids = [f"d-{i:02}" for i in range(12)]
        for i, did in enumerate(ids):
            await kit.store.enqueue(kit.dispatch(f"t-{i}", dispatch_id=did, priority=3))
        leases = await kit.store.claim_next("worker-a", 30, limit=5)
        leases += await kit.store.claim_next("worker-b", 30, limit=10)
        assert [lease.dispatch.dispatch_id for lease in leases] == ids

    @case
    async def test_available_at_is_respected(self, kit: Kit) -> None:
        later = await kit.now() + timedelta(seconds=10)
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="later", available_at=later))
        assert await kit.store.claim_next("worker-a", 30) == []
        await kit.advance(10.5)
        assert (await _lease_one(kit)).dispatch.dispatch_id == "later"

    @case
    async def test_a_thread_with_a_live_claim_yields_none_of_its_dispatches(self, kit: Kit) -> None:
        claim = await kit.claimed("t1", "runtime-x")
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-2"))
        assert await kit.store.claim_next("worker-a", 30, limit=10) == []
        await kit.store.release("t1", claim.token)
        leases = await kit.store.claim_next("worker-a", 30, limit=10)
        assert [lease.dispatch.dispatch_id for lease in leases] == ["d-1"], "one lease per thread"
        assert await kit.store.claim_next("worker-b", 30, limit=10) == []

    @case
    async def test_a_claim_for_one_thread_leaves_every_other_thread_alone(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t-other", dispatch_id="d-other", priority=9))
        await kit.store.enqueue(kit.dispatch("t-mine", dispatch_id="d-low"))
        # a resume is not queued behind the thread's run (it continues a suspended one)
        await kit.store.enqueue(
            kit.dispatch("t-mine", dispatch_id="d-high", kind="resume", priority=2)
        )
        leases = await kit.store.claim_next("worker-a", 30, limit=5, thread_id="t-mine")
        assert [x.dispatch.dispatch_id for x in leases] == ["d-high"], "one lease per thread"
        [lease] = leases
        assert lease.claim.thread_id == "t-mine" and lease.dispatch.token == lease.claim.token
        assert lease.dispatch.status == "leased" and lease.dispatch.attempts == 1
        assert lease.snapshot is not None and lease.snapshot == await kit.store.read("t-mine")
        other = await kit.store.get_dispatch("d-other")
        assert other is not None and other.status == "pending" and other.attempts == 0
        assert other.token is None and other.holder is None
        assert await kit.store.claim_next("worker-a", 30, thread_id="t-mine") == [], "live claim"
        assert await kit.store.claim_next("worker-a", 30, thread_id="t-none") == []
        assert await kit.store.claim_next("worker-a", 30, thread_id="t-other") != []

    @case
    async def test_a_claim_for_one_thread_takes_over_its_lapsed_lease(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t-mine", dispatch_id="d-1"))
        first = await _lease_one(kit, "worker-a", 10)
        await kit.store.enqueue(kit.dispatch("t-other", dispatch_id="d-other"))
        assert await kit.store.claim_next("worker-b", 10, thread_id="t-mine") == []
        await kit.advance(11)
        [again] = await kit.store.claim_next("worker-b", 10, limit=3, thread_id="t-mine")
        assert again.dispatch.dispatch_id == "d-1" and again.dispatch.attempts == 2
        assert again.claim.holder == "worker-b" and again.claim.token > first.claim.token
        other = await kit.store.get_dispatch("d-other")
        assert other is not None and other.status == "pending" and other.attempts == 0

    @case
    async def test_claim_grants_the_thread_claim_with_the_lease_token(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        lease = await _lease_one(kit, "worker-a", 20)
        assert lease.claim.thread_id == "t1" and lease.claim.holder == "worker-a"
        assert lease.dispatch.token == lease.claim.token
        assert lease.dispatch.status == "leased" and lease.dispatch.attempts == 1
        assert lease.dispatch.lease_until == lease.claim.expires_at
        assert not lease.exhausted
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim == lease.claim
        with pytest.raises(ThreadBusy) as busy:
            await kit.store.claim("t1", "someone", 30)
        assert busy.value.holder == "worker-a"
        receipt = await kit.store.commit(
            "t1", Commit(token=lease.claim.token, checkpoint=kit.checkpoint(None))
        )
        assert receipt.version == 1
        renewed = await kit.store.renew("t1", lease.claim.token, 60)
        stored = await kit.store.get_dispatch("d-1")
        assert stored is not None and stored.lease_until == renewed.expires_at

    @case
    async def test_settle_done(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        lease = await _lease_one(kit)
        done = await kit.store.settle("d-1", lease.claim.token, Done())
        assert done.status == "done"
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim is None, "settling releases the thread claim"
        assert await kit.store.claim_next("worker-b", 30) == []
        with pytest.raises(StaleClaim):
            await kit.store.settle("d-1", lease.claim.token, Done())

    @case
    async def test_settle_awaiting(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        lease = await _lease_one(kit)
        parked = await kit.store.settle("d-1", lease.claim.token, Awaiting())
        assert parked.status == "awaiting"
        assert await kit.store.claim_next("worker-b", 30) == []
        assert [d.dispatch_id for d in await kit.store.list_dispatches(status="awaiting")] == [
            "d-1"
        ]
        assert (await kit.claimed("t1", "resumer")).holder == "resumer"

    @case
    async def test_a_resume_retires_the_dispatches_parked_awaiting_input(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-start"))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-other"))
        leases = await kit.store.claim_next("worker-a", 30, limit=2)
        for lease in leases:
            await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Awaiting())
        resumed = await kit.store.enqueue(
            kit.dispatch("t1", dispatch_id="d-resume", kind="resume", payload={"answers": {}})
        )
        assert resumed.status == "pending"
        parked = await kit.store.get_dispatch("d-start")
        assert parked is not None and parked.status == "done"
        other = await kit.store.get_dispatch("d-other")
        assert other is not None and other.status == "awaiting", "only that thread's"
        again = await kit.store.enqueue(
            kit.dispatch("t1", dispatch_id="d-resume", kind="resume", payload={"answers": {}})
        )
        assert again == resumed

    @case
    async def test_settle_retry_keeps_the_error_and_delays(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        lease = await _lease_one(kit)
        retried = await kit.store.settle("d-1", lease.claim.token, Retry(5, "model overloaded"))
        assert retried.status == "scheduled" and retried.attempts == 1  # until its delay
        assert retried.last_error == "model overloaded" and retried.token is None
        if kit.exact_expiry:
            assert retried.available_at == kit.clock.now() + timedelta(seconds=5)
        assert await kit.store.claim_next("worker-b", 30) == []
        await kit.advance(5.5)
        again = await _lease_one(kit, "worker-b")
        assert again.dispatch.attempts == 2 and again.claim.token > lease.claim.token
        assert again.dispatch.last_error == "model overloaded"

    @case
    async def test_wrong_or_stale_tokens_are_refused_and_change_nothing(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        lease = await _lease_one(kit, "worker-a")
        with pytest.raises(StaleClaim):
            await kit.store.settle("d-1", lease.claim.token + 1, Done())
        with pytest.raises(NotFound):
            await kit.store.settle("d-unknown", lease.claim.token, Done())
        await kit.advance(31)
        successor = await _lease_one(kit, "worker-b")
        assert successor.claim.token > lease.claim.token
        before = await kit.store.get_dispatch("d-1")
        for outcome in (Done(), Awaiting(), Retry(0, "late")):
            with pytest.raises(StaleClaim):
                await kit.store.settle("d-1", lease.claim.token, outcome)
        with pytest.raises(StaleClaim):
            await kit.store.renew("t1", lease.claim.token, 30)
        with pytest.raises(StaleClaim):
            await kit.store.commit(
                "t1", Commit(token=lease.claim.token, events=(EventDraft(type="late"),))
            )
        assert await kit.store.get_dispatch("d-1") == before
        assert await kit.store.events_after("t1") == []
        assert (await kit.store.settle("d-1", successor.claim.token, Done())).status == "done"

    @case
    async def test_settle_after_the_thread_epoch_moved_on_is_refused(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-2"))
        first = await _lease_one(kit, "worker-a")
        await kit.store.release("t1", first.claim.token)
        direct = await kit.claimed("t1", "runtime-x")
        with pytest.raises(StaleClaim):
            await kit.store.settle("d-1", first.claim.token, Done())
        await kit.store.release("t1", direct.token)
        second = await _lease_one(kit, "worker-a")
        assert second.dispatch.dispatch_id == "d-1", "unsettled work is claimable again"
        await kit.store.delete_thread("t1")
        with pytest.raises(StaleClaim):
            await kit.store.settle("d-1", second.claim.token, Done())
        stored = await kit.store.get_dispatch("d-1")
        assert stored is not None and stored.status == "leased"

    @case
    async def test_an_expired_lease_is_claimable_again_and_the_attempt_counts(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1", max_attempts=5))
        first = await _lease_one(kit, "worker-a", 10)
        assert await kit.store.claim_next("worker-b", 10) == []
        await kit.advance(10.5)
        second = await _lease_one(kit, "worker-b", 10)
        assert second.dispatch.dispatch_id == "d-1" and second.dispatch.attempts == 2
        assert second.dispatch.holder == "worker-b"
        assert second.claim.token > first.claim.token

    @case
    async def test_lease_expiry_boundary_is_strict(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        await _lease_one(kit, "worker-a", 10)
        await kit.advance(10)
        assert await kit.store.claim_next("worker-b", 10) == [], "still leased at lease_until"
        await kit.advance(0.001)
        assert (await _lease_one(kit, "worker-b")).dispatch.dispatch_id == "d-1"

    @case
    async def test_an_exhausted_budget_marks_the_next_claim(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1", max_attempts=2))
        for attempt in (1, 2):
            lease = await _lease_one(kit, f"worker-{attempt}", 10)
            assert not lease.exhausted and lease.dispatch.attempts == attempt
            await kit.advance(11)
        last = await _lease_one(kit, "worker-3", 10)
        assert last.exhausted and last.dispatch.attempts == 3
        done = await kit.store.settle("d-1", last.claim.token, Done())
        assert done.status == "done"

    @case
    async def test_quarantine_is_refused_for_work_that_is_not_exhausted(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1", max_attempts=2))
        with pytest.raises(InvalidState):
            await kit.store.quarantine("d-1")
        await _lease_one(kit, "worker-a", 10)
        with pytest.raises(InvalidState):
            await kit.store.quarantine("d-1")
        with pytest.raises(NotFound):
            await kit.store.quarantine("d-missing")
        stored = await kit.store.get_dispatch("d-1")
        assert stored is not None and stored.status == "leased"

    @case
    async def test_quarantine_then_requeue_gives_a_fresh_budget(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1", max_attempts=2))
        for _ in range(2):
            await _lease_one(kit, "worker-a", 10)
            await kit.advance(11)
        with pytest.raises(InvalidState):
            await kit.store.requeue("d-1")
        parked = await kit.store.quarantine("d-1")
        assert parked.status == "quarantined"
        assert await kit.store.claim_next("worker-b", 10) == [], "quarantined work is not claimed"
        listed = await kit.store.list_dispatches(status="quarantined")
        assert [d.dispatch_id for d in listed] == ["d-1"]
        fresh = await kit.store.requeue("d-1")
        assert fresh.status == "pending" and fresh.attempts == 0
        lease = await _lease_one(kit, "worker-b", 10)
        assert lease.dispatch.attempts == 1 and not lease.exhausted

    @case
    async def test_purge(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1", max_attempts=1))
        with pytest.raises(InvalidState):
            await kit.store.purge("d-1")
        await _lease_one(kit, "worker-a", 10)
        await kit.advance(11)
        await kit.store.quarantine("d-1")
        await kit.store.purge("d-1")
        assert await kit.store.get_dispatch("d-1") is None
        assert await kit.store.list_dispatches() == []
        with pytest.raises(NotFound):
            await kit.store.purge("d-1")

    @case
    async def test_dedupe_with_the_same_payload_returns_the_existing_dispatch(
        self, kit: Kit
    ) -> None:
        first = await kit.store.enqueue(
            kit.dispatch("t1", dispatch_id="d-1", payload={"a": 1, "b": 2}, dedupe_key="k-1")
        )
        again = await kit.store.enqueue(
            kit.dispatch("t1", dispatch_id="d-1", payload={"b": 2, "a": 1}, dedupe_key="k-1")
        )
        assert again == first
        by_key = await kit.store.enqueue(
            kit.dispatch("t1", dispatch_id="d-2", payload={"a": 1, "b": 2}, dedupe_key="k-1")
        )
        assert by_key == first
        assert len(await kit.store.list_dispatches()) == 1

    @case
    async def test_dedupe_with_a_different_payload_fails_closed(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1", payload={"a": 1}))
        with pytest.raises(DispatchConflict):
            await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1", payload={"a": 2}))
        with pytest.raises(DispatchConflict):
            await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-1", payload={"a": 1}))
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-2", dedupe_key="k", payload=1))
        with pytest.raises(DispatchConflict):
            await kit.store.enqueue(
                kit.dispatch("t1", dispatch_id="d-3", dedupe_key="k", payload=2)
            )
        assert [d.dispatch_id for d in await kit.store.list_dispatches()] == ["d-1", "d-2"]

    @case
    async def test_concurrent_enqueue_with_one_dedupe_key_creates_one_dispatch(
        self, kit: Kit
    ) -> None:
        stores = [kit.store, *[await kit.sibling() for _ in range(3)]]

        async def submit(i: int) -> Dispatch:
            store = stores[i % len(stores)]
            return await store.enqueue(
                kit.dispatch("t1", dispatch_id=f"d-{i}", dedupe_key="once", payload={"x": 1})
            )

        results = await asyncio.gather(*(submit(i) for i in range(16)))
        assert len({d.dispatch_id for d in results}) == 1
        assert len(await kit.store.list_dispatches()) == 1

    @case
    async def test_cancel_of_pending_work(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-other"))
        intent = await kit.store.cancel("t1", "user asked")
        assert intent.kind == "cancel" and intent.thread_id == "t1" and intent.status == "pending"
        retired = await kit.store.get_dispatch("d-1")
        assert retired is not None and retired.status == "done"
        assert retired.last_error is not None and "user asked" in retired.last_error
        assert await kit.store.cancel("t1", "again") == intent, "one pending cancel per thread"
        leases = await kit.store.claim_next("worker-a", 30, limit=10)
        assert [lease.dispatch.dispatch_id for lease in leases] == [intent.dispatch_id, "d-other"]
        assert leases[0].dispatch.payload == {"reason": "user asked"}

    @case
    async def test_cancel_of_leased_work_fences_its_owner(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        lease = await _lease_one(kit, "worker-a")
        await kit.store.commit(
            "t1", Commit(token=lease.claim.token, checkpoint=kit.checkpoint(None))
        )
        intent = await kit.store.cancel("t1", "stop")
        with pytest.raises(StaleClaim):
            await kit.store.renew("t1", lease.claim.token, 30)
        with pytest.raises(StaleClaim):
            await kit.store.commit(
                "t1", Commit(token=lease.claim.token, events=(EventDraft(type="late"),))
            )
        with pytest.raises(StaleClaim):
            await kit.store.settle("d-1", lease.claim.token, Done())
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim is None, "cancel releases the lease"
        canceller = await _lease_one(kit, "worker-b")
        assert canceller.dispatch.dispatch_id == intent.dispatch_id
        assert canceller.claim.token > lease.claim.token
        await kit.store.commit(
            "t1",
            Commit(
                token=canceller.claim.token,
                checkpoint=kit.checkpoint(
                    snap.checkpoint.id if snap.checkpoint else None, status="cancelled"
                ),
            ),
        )
        assert (
            await kit.store.settle(intent.dispatch_id, canceller.claim.token, Done())
        ).status == "done"

    @case
    async def test_concurrent_claim_next_leases_every_dispatch_exactly_once(self, kit: Kit) -> None:
        for i in range(100):
            await kit.store.enqueue(kit.dispatch(f"t-{i}", dispatch_id=f"d-{i}"))
        stores = [kit.store, *[await kit.sibling() for _ in range(3)]]

        async def drain(w: int) -> list[str]:
            got: list[str] = []
            store = stores[w % len(stores)]
            while leases := await store.claim_next(f"worker-{w}", 60, limit=3):
                got += [lease.dispatch.dispatch_id for lease in leases]
            return got

        results = await asyncio.gather(*(drain(w) for w in range(16)))
        leased = [d for got in results for d in got]
        assert sorted(leased) == sorted(f"d-{i}" for i in range(100))
        assert len(leased) == len(set(leased)) == 100

    @case
    async def test_worker_registry_generations_and_incarnations(self, kit: Kit) -> None:
        first = await kit.store.register_worker("w-1")
        second = await kit.store.register_worker("w-1")
        other = await kit.store.register_worker("w-2")
        assert second.generation > first.generation
        assert second.incarnation_id != first.incarnation_id
        assert other.generation >= 1
        await kit.store.heartbeat(second)
        with pytest.raises(WorkerSuperseded):
            await kit.store.heartbeat(first)
        third = await (await kit.reopen()).register_worker("w-1")
        assert third.generation > second.generation
        listed = {w.worker_id: w for w in await kit.store.list_workers()}
        assert set(listed) == {"w-1", "w-2"}
        assert listed["w-1"].generation == third.generation
        assert listed["w-1"].incarnation_id == third.incarnation_id

    @case
    async def test_a_worker_stop_is_recorded_for_its_incarnation_only(self, kit: Kit) -> None:
        first = await kit.store.register_worker("w-1")
        second = await kit.store.register_worker("w-1")
        with pytest.raises(WorkerSuperseded):
            await kit.store.retire_worker(first)
        listed = {w.worker_id: w for w in await kit.store.list_workers()}
        assert listed["w-1"].stopped_at is None, "a stale incarnation stopped the newer one"
        with pytest.raises(NotFound):
            await kit.store.retire_worker(
                WorkerIdentity(worker_id="w-never", incarnation_id="x", generation=1)
            )
        await kit.advance(5)
        stopped = await kit.store.retire_worker(second)
        assert stopped.incarnation_id == second.incarnation_id
        assert stopped.stopped_at is not None
        assert stopped.stopped_at >= stopped.last_heartbeat
        await kit.advance(5)
        again = await kit.store.retire_worker(second)
        assert again.stopped_at == stopped.stopped_at, "a second stop keeps the first time"
        await kit.store.heartbeat(second)
        reopened = {w.worker_id: w for w in await (await kit.reopen()).list_workers()}
        assert reopened["w-1"].stopped_at == stopped.stopped_at
        third = await kit.store.register_worker("w-1")
        listed = {w.worker_id: w for w in await kit.store.list_workers()}
        assert listed["w-1"].incarnation_id == third.incarnation_id
        assert listed["w-1"].stopped_at is None, "a new registration runs again"
