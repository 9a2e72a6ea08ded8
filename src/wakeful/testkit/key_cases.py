"""Conformance cases: concurrency keys (issue 39). At most ``concurrency_limit`` dispatches
of one ``concurrency_key`` are admitted (``pending`` or ``leased``) at once; the others wait
``waiting_key`` (holding their thread's run slot) until an admitted one settles, is
suspended, quarantined or cancelled."""

from __future__ import annotations

import msgspec
import pytest

from wakeful.concurrency import KeyUse
from wakeful.errors import InvalidInput, ThreadBusy
from wakeful.records import Awaiting, Dispatch, Done, Lease, Retry
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


def keyed(
    kit: Kit,
    thread_id: str,
    dispatch_id: str,
    key: str = "k",
    limit: int = 3,
    *,
    kind: str = "start",
    priority: int = 0,
) -> Dispatch:
    d = kit.dispatch(thread_id, dispatch_id=dispatch_id, kind=kind, priority=priority)
    return msgspec.structs.replace(d, concurrency_key=key, concurrency_limit=limit)


async def _status(kit: Kit, dispatch_id: str) -> str:
    d = await kit.store.get_dispatch(dispatch_id)
    assert d is not None, dispatch_id
    return d.status


async def _statuses(kit: Kit, ids: list[str]) -> list[str]:
    return [await _status(kit, did) for did in ids]


async def _use(kit: Kit) -> list[KeyUse]:
    keys = getattr(kit.store, "concurrency_keys", None)
    if keys is None:
        pytest.skip(f"{type(kit.store).__name__} has no concurrency_keys()")
    found: list[KeyUse] = await keys()
    return found


class KeyCases(Harness):
    @case
    async def test_a_key_admits_at_most_its_limit_and_the_rest_wait(self, kit: Kit) -> None:
        ids = [f"d-{i}" for i in range(10)]
        stored = [await kit.store.enqueue(keyed(kit, f"t{i}", did)) for i, did in enumerate(ids)]
        assert [d.status for d in stored] == ["pending"] * 3 + ["waiting_key"] * 7
        assert stored[0].concurrency_key == "k" and stored[0].concurrency_limit == 3
        assert await _use(kit) == [KeyUse(key="k", limit=3, admitted=3, waiting=7)]
        depths = await kit.store.queue_depths()
        assert (depths["pending"], depths["waiting_key"]) == (3, 7)
        waiting = await kit.store.list_dispatches(status="waiting_key")
        assert [d.dispatch_id for d in waiting] == ids[3:]

        ran: list[str] = []
        while len(ran) < len(ids):
            leases = await kit.store.claim_next("worker-a", 30, limit=10)
            assert 1 <= len(leases) <= 3, [lease.dispatch.dispatch_id for lease in leases]
            leased = len(await kit.store.list_dispatches(status="leased", limit=100))
            assert leased <= 3, "never more than the limit leased"
            lease = leases[0]
            ran.append(lease.dispatch.dispatch_id)
            await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
            for other in leases[1:]:  # give the others back: they keep their slots
                await kit.store.release(other.claim.thread_id, other.claim.token)
        assert sorted(ran) == sorted(ids) and len(set(ran)) == len(ids)
        assert await _use(kit) == []

    @case
    async def test_waiting_dispatches_are_admitted_by_priority_then_enqueue_order(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(keyed(kit, "t0", "d-0", limit=1))
        await kit.store.enqueue(keyed(kit, "t1", "d-1", limit=1))
        await kit.store.enqueue(keyed(kit, "t2", "d-2", limit=1, priority=5))
        await kit.store.enqueue(keyed(kit, "t3", "d-3", limit=1))
        order = []
        for _ in range(4):
            (lease,) = await kit.store.claim_next("w", 30, limit=10)
            order.append(lease.dispatch.dispatch_id)
            await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
        assert order == ["d-0", "d-2", "d-1", "d-3"]

    @case
    async def test_a_lapsed_lease_keeps_its_slot_and_leaks_no_capacity(self, kit: Kit) -> None:
        ids = [f"d-{i}" for i in range(10)]
        for i, did in enumerate(ids):
            await kit.store.enqueue(keyed(kit, f"t{i}", did))
        first = await kit.store.claim_next("worker-a", 5, limit=10)
        assert len(first) == 3
        await kit.advance(6)  # worker-a died: its three leases lapse
        again = await kit.store.claim_next("worker-b", 30, limit=10)
        assert sorted(lease.dispatch.dispatch_id for lease in again) == ids[:3], (
            "the lapsed leases are taken over in their slots, nothing more is admitted"
        )
        assert await _use(kit) == [KeyUse(key="k", limit=3, admitted=3, waiting=7)]
        done: set[str] = set()
        pending: list[Lease] = list(again)
        while pending:
            lease = pending.pop()
            await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
            done.add(lease.dispatch.dispatch_id)
            pending.extend(await kit.store.claim_next("worker-b", 30, limit=10))
            assert len(await kit.store.list_dispatches(status="leased", limit=100)) <= 3
        assert done == set(ids), "the 4th to the 10th still ran after the holders died"

    @case
    async def test_a_suspended_run_frees_its_key_slot_and_its_resume_waits_for_one(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(keyed(kit, "t1", "d-1", limit=1))
        await kit.store.enqueue(keyed(kit, "t2", "d-2", limit=1))
        (lease,) = await kit.store.claim_next("w", 30, limit=10)
        assert lease.dispatch.dispatch_id == "d-1"
        await kit.store.settle("d-1", lease.claim.token, Awaiting())
        assert await _statuses(kit, ["d-1", "d-2"]) == ["awaiting", "pending"]
        # the resume (no key given) takes the run's key and waits for a slot
        resume = await kit.store.enqueue(kit.dispatch("t1", dispatch_id="r-1", kind="resume"))
        assert (resume.concurrency_key, resume.status) == ("k", "waiting_key")
        (lease2,) = await kit.store.claim_next("w", 30, limit=10)
        assert lease2.dispatch.dispatch_id == "d-2"
        await kit.store.settle("d-2", lease2.claim.token, Done())
        assert await _status(kit, "r-1") == "pending"
        (lease3,) = await kit.store.claim_next("w", 30, limit=10)
        assert lease3.dispatch.dispatch_id == "r-1"

    @case
    async def test_a_resume_takes_its_runs_key_when_the_run_has_one(self, kit: Kit) -> None:
        await kit.store.enqueue(keyed(kit, "t1", "d-1", limit=1))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-2"))
        for lease in await kit.store.claim_next("w", 30, limit=10):
            await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Awaiting())
        own = await kit.store.enqueue(keyed(kit, "t1", "r-1", key="other", kind="resume"))
        assert (own.concurrency_key, own.concurrency_limit) == ("k", 1), "the run's key"
        given = await kit.store.enqueue(keyed(kit, "t2", "r-2", key="other", kind="resume"))
        assert (given.concurrency_key, given.status) == ("other", "pending"), "its own"

    @case
    async def test_a_waiting_dispatch_holds_its_thread_slot(self, kit: Kit) -> None:
        await kit.store.enqueue(keyed(kit, "t1", "d-1", limit=1))
        waiting = await kit.store.enqueue(keyed(kit, "t2", "d-2", limit=1))
        assert waiting.status == "waiting_key"
        behind = await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-3"))
        assert (behind.status, behind.queued_behind) == ("queued", "d-2")
        refused = msgspec.structs.replace(kit.dispatch("t2", dispatch_id="d-4"), if_busy="reject")
        with pytest.raises(ThreadBusy):
            await kit.store.enqueue(refused)
        assert await kit.store.get_dispatch("d-4") is None

    @case
    async def test_cancel_frees_the_slot_and_retires_a_waiting_run(self, kit: Kit) -> None:
        for i in range(1, 4):
            await kit.store.enqueue(keyed(kit, f"t{i}", f"d-{i}", limit=1))
        (lease,) = await kit.store.claim_next("w", 30, limit=10)
        assert lease.dispatch.dispatch_id == "d-1"
        await kit.store.cancel("t1", "stop")
        assert await _statuses(kit, ["d-1", "d-2", "d-3"]) == ["done", "pending", "waiting_key"]
        await kit.store.cancel("t3", "never mind")
        assert await _status(kit, "d-3") == "done"
        assert await _use(kit) == [KeyUse(key="k", limit=1, admitted=1, waiting=0)]

    @case
    async def test_a_retry_keeps_its_slot_quarantine_frees_it_requeue_asks_again(
        self, kit: Kit
    ) -> None:
        first = keyed(kit, "t1", "d-1", limit=1)
        await kit.store.enqueue(msgspec.structs.replace(first, max_attempts=1))
        await kit.store.enqueue(keyed(kit, "t2", "d-2", limit=1))
        (lease,) = await kit.store.claim_next("w", 30, limit=10)
        await kit.store.settle("d-1", lease.claim.token, Retry(0, "again"))
        assert await _statuses(kit, ["d-1", "d-2"]) == ["pending", "waiting_key"]
        (lease,) = await kit.store.claim_next("w", 30, limit=10)
        assert lease.dispatch.dispatch_id == "d-1" and lease.exhausted
        await kit.store.release("t1", lease.claim.token)
        await kit.store.quarantine("d-1")
        assert await _statuses(kit, ["d-1", "d-2"]) == ["quarantined", "pending"]
        requeued = await kit.store.requeue("d-1")
        assert requeued.status == "waiting_key", "the key is full: it waits again"
        (lease,) = await kit.store.claim_next("w", 30, limit=10)
        assert lease.dispatch.dispatch_id == "d-2"
        await kit.store.settle("d-2", lease.claim.token, Done())
        assert await _status(kit, "d-1") == "pending"

    @case
    async def test_keys_are_independent_and_the_latest_limit_applies(self, kit: Kit) -> None:
        await kit.store.enqueue(keyed(kit, "a1", "a-1", key="a", limit=1))
        await kit.store.enqueue(keyed(kit, "a2", "a-2", key="a", limit=1))
        await kit.store.enqueue(keyed(kit, "b1", "b-1", key="b", limit=1))
        assert await _statuses(kit, ["a-1", "a-2", "b-1"]) == ["pending", "waiting_key", "pending"]
        # a later enqueue raises the limit: the waiting one is admitted first
        raised = await kit.store.enqueue(keyed(kit, "a3", "a-3", key="a", limit=3))
        assert await _status(kit, "a-2") == "pending" and raised.status == "pending"
        assert await _use(kit) == [
            KeyUse(key="a", limit=3, admitted=3, waiting=0),
            KeyUse(key="b", limit=1, admitted=1, waiting=0),
        ]
        unkeyed = await kit.store.enqueue(kit.dispatch("u1", dispatch_id="u-1"))
        assert unkeyed.status == "pending" and unkeyed.concurrency_key is None

    @case
    async def test_keys_survive_a_reopen(self, kit: Kit) -> None:
        for i in range(4):
            await kit.store.enqueue(keyed(kit, f"t{i}", f"d-{i}", limit=2))
        (lease, _) = await kit.store.claim_next("w", 30, limit=10)
        await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
        before = await _use(kit)
        assert before == [KeyUse(key="k", limit=2, admitted=2, waiting=1)]
        store = await kit.reopen()
        assert await _use(kit) == before
        assert [d.dispatch_id for d in await store.list_dispatches(status="waiting_key")] == ["d-3"]

    @case
    async def test_bad_keys_are_refused(self, kit: Kit) -> None:
        d = kit.dispatch("t1", dispatch_id="d-1")
        for key, limit in (("k", None), (None, 3), ("k", 0), ("", 1), ("a\nb", 1), ("x" * 201, 1)):
            bad = msgspec.structs.replace(d, concurrency_key=key, concurrency_limit=limit)
            with pytest.raises(InvalidInput):
                await kit.store.enqueue(bad)
        assert await kit.store.get_dispatch("d-1") is None


def _for(kit: Kit, tenant: str | None, i: int, priority: int = 0) -> Dispatch:
    d = kit.dispatch(f"{tenant}-t{i}", dispatch_id=f"{tenant}-{i}", priority=priority)
    return msgspec.structs.replace(d, tenant=tenant)


async def _claim_order(kit: Kit, n: int) -> list[str]:
    order = []
    for _ in range(n):
        (lease,) = await kit.store.claim_next("w", 30)
        order.append(lease.dispatch.dispatch_id)
        await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
    return order


class FairCases(Harness):
    backlog = 200
    """How many dispatches the busy tenant has pending (the fleet test uses 20,000)."""

    @case
    async def test_a_single_dispatch_is_not_delayed_by_another_tenants_backlog(
        self, kit: Kit
    ) -> None:
        for i in range(self.backlog):
            await kit.store.enqueue(_for(kit, "a", i))
        await _claim_order(kit, 3)  # the backlog is being served
        await kit.store.enqueue(_for(kit, "b", 0))
        assert await _claim_order(kit, 1) == ["b-0"], "the next claim takes the other tenant"
        assert await _claim_order(kit, 2) == ["a-3", "a-4"]

    @case
    async def test_tenants_of_equal_priority_are_served_round_robin(self, kit: Kit) -> None:
        for i in range(4):
            await kit.store.enqueue(_for(kit, "a", i))
        for i in range(4):
            await kit.store.enqueue(_for(kit, "b", i))
        for i in range(2):
            await kit.store.enqueue(_for(kit, None, i))
        order = await _claim_order(kit, 10)
        # each later tenant starts one place before the head (where the work being served
        # stands); after that the tenants alternate
        assert order == ["None-0", "b-0", "None-1", "a-0", "b-1", "a-1", "b-2", "a-2", "b-3", "a-3"]

    @case
    async def test_priority_comes_before_fairness(self, kit: Kit) -> None:
        for i in range(3):
            await kit.store.enqueue(_for(kit, "a", i, priority=1))
        await kit.store.enqueue(_for(kit, "b", 0))
        assert await _claim_order(kit, 4) == ["a-0", "a-1", "a-2", "b-0"]

    @case
    async def test_a_retried_dispatch_keeps_its_place(self, kit: Kit) -> None:
        for i in range(3):
            await kit.store.enqueue(_for(kit, "a", i))
        (lease,) = await kit.store.claim_next("w", 30)
        assert lease.dispatch.dispatch_id == "a-0"
        await kit.store.settle("a-0", lease.claim.token, Retry(0, "again"))
        await kit.store.enqueue(_for(kit, "b", 0))
        assert await _claim_order(kit, 4) == ["b-0", "a-0", "a-1", "a-2"]


__all__ = ["FairCases", "KeyCases"]
