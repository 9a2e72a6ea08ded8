"""Conformance cases: tenant-scoped dispatch listings, queue depths, and leases whose claim
moved (renewed, released, deleted) as ``claim_next`` sees them (issue 27)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from wakeful.errors import InvalidInput
from wakeful.records import Commit, Dispatch, Done
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


def _for(kit: Kit, thread_id: str, tenant: str | None, dispatch_id: str) -> Dispatch:
    d = kit.dispatch(thread_id, dispatch_id=dispatch_id)
    return Dispatch(
        dispatch_id=d.dispatch_id,
        thread_id=d.thread_id,
        kind=d.kind,
        payload=d.payload,
        max_attempts=d.max_attempts,
        tenant=tenant,
    )


async def _ids(kit: Kit, **filters: object) -> list[str]:
    return [d.dispatch_id for d in await kit.store.list_dispatches(**filters)]  # type: ignore[arg-type]


class ListingCases(Harness):
    @case
    async def test_a_tenant_listing_holds_what_the_tenant_may_see(self, kit: Kit) -> None:
        await kit.store.enqueue(_for(kit, "a1", "alpha", "d-a1"))
        await kit.store.enqueue(_for(kit, "b1", "beta", "d-b1"))
        await kit.store.enqueue(_for(kit, "a2", "alpha", "d-a2"))
        cancel = await kit.store.cancel("a1", "stop")  # names no tenant: alpha's by its thread
        await kit.store.enqueue(_for(kit, "loose", None, "d-loose"))  # an unbound thread
        assert await _ids(kit, tenant="alpha") == ["d-a1", "d-a2", cancel.dispatch_id]
        assert await _ids(kit, tenant="beta") == ["d-b1"]
        assert await _ids(kit, tenant="gamma") == []
        assert await _ids(kit, tenant="alpha", thread_id="a2") == ["d-a2"]
        assert await _ids(kit, tenant="alpha", thread_id="b1") == []
        assert await _ids(kit, tenant="alpha", status="done") == ["d-a1"]
        assert await _ids(kit, tenant="alpha", after="d-a2", limit=1) == [cancel.dispatch_id]
        assert await _ids(kit, tenant="alpha", limit=1) == ["d-a1"]
        # the unbound thread's work becomes beta's when its first commit fixes the tenant
        claim = await kit.store.claim("loose", "holder-a", 30)
        await kit.store.commit(
            "loose", Commit(token=claim.token, checkpoint=kit.checkpoint(None, tenant="beta"))
        )
        assert await _ids(kit, tenant="beta") == ["d-b1", "d-loose"]
        # a deleted thread is nobody's; bound again to another tenant, that tenant sees the
        # work submitted for no tenant, never the work submitted for the first
        await kit.store.delete_thread("a1")
        assert await _ids(kit, tenant="alpha") == ["d-a2"]
        await kit.store.enqueue(_for(kit, "a1", "beta", "d-a1-beta"))
        assert await _ids(kit, tenant="beta") == [
            "d-b1",
            cancel.dispatch_id,
            "d-loose",
            "d-a1-beta",
        ]
        assert await _ids(kit) == [
            "d-a1",
            "d-b1",
            "d-a2",
            cancel.dispatch_id,
            "d-loose",
            "d-a1-beta",
        ]

    @case
    async def test_a_tenant_listing_follows_the_write_that_binds_the_thread(self, kit: Kit) -> None:
        cancel = await kit.store.cancel("t1", "before anything")  # on a thread nobody owns
        assert await _ids(kit, tenant="alpha") == []
        await kit.store.enqueue(_for(kit, "t1", "alpha", "d-1"))
        assert await _ids(kit, tenant="alpha") == [cancel.dispatch_id, "d-1"]
        with pytest.raises(InvalidInput):
            await kit.store.list_dispatches(tenant="")

    @case
    async def test_queue_depths_count_open_work_by_status_up_to_the_limit(self, kit: Kit) -> None:
        empty = await kit.store.queue_depths()
        assert empty == {
            "scheduled": 0,
            "queued": 0,
            "waiting_key": 0,
            "pending": 0,
            "leased": 0,
            "awaiting": 0,
            "quarantined": 0,
        }
        for i in range(5):
            await kit.store.enqueue(kit.dispatch(f"t{i}", dispatch_id=f"d-{i}"))
        later = await kit.now() + timedelta(seconds=60)
        await kit.store.enqueue(kit.dispatch("t9", dispatch_id="d-later", available_at=later))
        leases = await kit.store.claim_next("worker-a", 30, limit=2)
        await kit.store.settle(leases[0].dispatch.dispatch_id, leases[0].claim.token, Done())
        assert await kit.store.queue_depths() == {
            "scheduled": 1,
            "queued": 0,
            "waiting_key": 0,
            "pending": 3,
            "leased": 1,
            "awaiting": 0,
            "quarantined": 0,
        }
        assert await kit.store.queue_depths(limit=2) == {
            "scheduled": 1,
            "queued": 0,
            "waiting_key": 0,
            "pending": 2,
            "leased": 1,
            "awaiting": 0,
            "quarantined": 0,
        }
        for bad in (0, -1, True, 1.5):
            with pytest.raises(InvalidInput):
                await kit.store.queue_depths(limit=bad)  # type: ignore[arg-type]

    @case
    async def test_a_lease_is_held_exactly_while_its_claim_is(self, kit: Kit) -> None:
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d-1"))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="d-2"))
        first = await kit.store.claim_next("worker-a", 30, limit=2)
        assert [x.dispatch.dispatch_id for x in first] == ["d-1", "d-2"]
        held, dropped = first
        await kit.store.renew("t1", held.claim.token, 300)  # the lease follows the claim
        await kit.advance(60)
        again = await kit.store.claim_next("worker-b", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in again] == ["d-2"], "expired, not renewed"
        assert again[0].dispatch.attempts == 2
        await kit.store.release("t1", held.claim.token)  # released without settling
        released = await kit.store.claim_next("worker-c", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in released] == ["d-1"]
        await kit.store.delete_thread("t2")  # a deleted thread's lease holds nothing
        deleted = await kit.store.claim_next("worker-d", 30, limit=5)
        assert [x.dispatch.dispatch_id for x in deleted] == ["d-2"]
        assert dropped.claim.token < deleted[0].claim.token
        assert await kit.store.claim_next("worker-e", 30, limit=5) == []
