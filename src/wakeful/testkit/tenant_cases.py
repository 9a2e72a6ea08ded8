"""Conformance cases: a thread's tenant is fixed by the first write that names one (an
enqueue, a claim, a lease of a tenant's dispatch, or the first commit), atomically with that
write; a write naming another tenant is ``TenantMismatch`` and changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from wakeful.errors import TenantMismatch, ThreadBusy
from wakeful.records import Commit, Dispatch, Done, EventDraft, Settle, ThreadSnapshot
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


def _of(kit: Kit, thread_id: str, tenant: str | None, dispatch_id: str | None = None) -> Dispatch:
    d = kit.dispatch(thread_id, dispatch_id=dispatch_id)
    return Dispatch(
        dispatch_id=d.dispatch_id,
        thread_id=d.thread_id,
        kind=d.kind,
        payload=d.payload,
        max_attempts=d.max_attempts,
        tenant=tenant,
    )


async def _bound(kit: Kit, thread_id: str, tenant: str | None) -> ThreadSnapshot:
    snap = await kit.store.read(thread_id)
    assert snap is not None and snap.tenant_bound and snap.tenant == tenant, snap
    return snap


class TenantCases(Harness):
    @case
    async def test_the_first_enqueue_fixes_the_tenant_and_a_foreign_write_changes_nothing(
        self, kit: Kit
    ) -> None:
        mine = await kit.store.enqueue(_of(kit, "t1", "alpha", "d-alpha"))
        assert mine.tenant == "alpha" and (await kit.store.get_dispatch("d-alpha")) == mine
        before = await _bound(kit, "t1", "alpha")
        assert before.version == 0 and before.claim is None
        with pytest.raises(TenantMismatch):
            await kit.store.enqueue(_of(kit, "t1", "beta", "d-beta"))
        with pytest.raises(TenantMismatch):
            await kit.store.claim("t1", "holder-beta", 30, tenant="beta")
        with pytest.raises(TenantMismatch):
            await kit.store.claim_and_commit(
                "t1", "holder-beta", 30, Commit(token=0, checkpoint=kit.checkpoint(None))
            )
        assert await kit.store.get_dispatch("d-beta") is None
        assert [d.dispatch_id for d in await kit.store.list_dispatches(thread_id="t1")] == [
            "d-alpha"
        ]
        assert await kit.store.read("t1") == before, "a refused write changes nothing"
        # the owner and writes that name no tenant go on; no token was spent by the refusals
        await kit.store.enqueue(_of(kit, "t1", None, "d-internal"))
        claim = await kit.store.claim("t1", "holder-alpha", 30, tenant="alpha")
        assert claim.token == 1
        for foreign in ("beta", None):
            with pytest.raises(TenantMismatch):
                await kit.store.commit(
                    "t1", Commit(token=claim.token, checkpoint=kit.checkpoint(None, tenant=foreign))
                )
        receipt = await kit.store.commit(
            "t1", Commit(token=claim.token, checkpoint=kit.checkpoint(None, tenant="alpha"))
        )
        assert receipt.version == 1
        assert (await _bound(kit, "t1", "alpha")).version == 1
        assert [t.thread_id for t in await kit.store.list_threads(tenant="alpha")] == ["t1"]

    @case
    async def test_a_claim_naming_a_tenant_fixes_it_and_a_foreign_claim_is_not_busy(
        self, kit: Kit
    ) -> None:
        claim = await kit.store.claim("t1", "holder-alpha", 30, tenant="alpha")
        await _bound(kit, "t1", "alpha")
        # the tenant is judged before the live claim: a busy refusal would name the holder
        with pytest.raises(TenantMismatch):
            await kit.store.claim("t1", "holder-beta", 30, tenant="beta")
        with pytest.raises(ThreadBusy):
            await kit.store.claim("t1", "holder-alpha-2", 30, tenant="alpha")
        await kit.store.release("t1", claim.token)
        with pytest.raises(TenantMismatch):
            await kit.store.enqueue(_of(kit, "t1", "beta"))
        assert await kit.store.list_dispatches(thread_id="t1") == []

    @case
    async def test_a_first_commit_without_a_checkpoint_keeps_the_fixed_tenant(
        self, kit: Kit
    ) -> None:
        """Work refused or exhausted on a new thread: the worker's first commit is an event
        (and the settle) without a checkpoint; the thread stays its submitter's."""
        await kit.store.enqueue(_of(kit, "t1", "alpha", "d-1"))
        [lease] = await kit.store.claim_next("worker-a", 30)
        assert lease.snapshot is not None and lease.snapshot.tenant == "alpha"
        await kit.store.commit(
            "t1",
            Commit(
                token=lease.claim.token,
                events=(EventDraft(type="dispatch.refused", data={"reason": "unknown"}),),
                settle=Settle(dispatch_id="d-1", outcome=Done()),
            ),
        )
        snap = await _bound(kit, "t1", "alpha")
        assert snap.version == 1 and snap.checkpoint is None
        assert [t.thread_id for t in await kit.store.list_threads(tenant="alpha")] == ["t1"]
        with pytest.raises(TenantMismatch):
            await kit.store.enqueue(_of(kit, "t1", "beta"))

    @case
    async def test_a_thread_committed_without_a_tenant_refuses_one(self, kit: Kit) -> None:
        claim, _ = await kit.started("t1")
        await kit.store.release("t1", claim.token)
        await _bound(kit, "t1", None)
        with pytest.raises(TenantMismatch):
            await kit.store.enqueue(_of(kit, "t1", "alpha"))
        with pytest.raises(TenantMismatch):
            await kit.store.claim("t1", "holder-alpha", 30, tenant="alpha")
        await kit.store.enqueue(_of(kit, "t1", None, "d-none"))

    @case
    async def test_a_lease_fixes_the_tenant_of_an_unbound_thread_and_delete_unbinds(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(_of(kit, "t1", "alpha", "d-1"))
        await kit.store.delete_thread("t1")
        assert await kit.store.read("t1") is None, "deletion removes the binding too"
        [lease] = await kit.store.claim_next("worker-a", 30)
        assert lease.dispatch.tenant == "alpha"
        await _bound(kit, "t1", "alpha")
        with pytest.raises(TenantMismatch):
            await kit.store.enqueue(_of(kit, "t1", "beta"))

    @case
    async def test_a_lease_for_one_thread_fixes_the_tenant_of_an_unbound_thread(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(_of(kit, "t1", "alpha", "d-1"))
        await kit.store.delete_thread("t1")
        [lease] = await kit.store.claim_next("worker-a", 30, thread_id="t1")
        assert lease.snapshot is not None and lease.snapshot.tenant == "alpha"
        await _bound(kit, "t1", "alpha")
        with pytest.raises(TenantMismatch):
            await kit.store.enqueue(_of(kit, "t1", "beta"))

    @case
    async def test_the_same_dispatch_id_from_another_tenant_is_no_replay(self, kit: Kit) -> None:
        await kit.store.enqueue(_of(kit, "t1", "alpha", "d-1"))
        with pytest.raises(TenantMismatch):
            await kit.store.enqueue(_of(kit, "t1", "beta", "d-1"))
        again = await kit.store.enqueue(_of(kit, "t1", "alpha", "d-1"))
        assert again.tenant == "alpha"
        assert len(await kit.store.list_dispatches(thread_id="t1")) == 1

    @case
    async def test_concurrent_first_writes_of_two_tenants_exactly_one_wins(self, kit: Kit) -> None:
        """Every kind of first write, from both tenants, through several handles on the same
        storage (connections or processes where the store has them)."""
        stores = [kit.store, *[await kit.sibling() for _ in range(3)]]
        threads = [f"race-{i}" for i in range(6)]

        async def attempt(thread_id: str, i: int) -> tuple[str, str, Any]:
            tenant = ("alpha", "beta")[i % 2]
            store = stores[i % len(stores)]
            try:
                match i % 3:
                    case 0:
                        d = _of(kit, thread_id, tenant, f"{thread_id}-d{i}")
                        return tenant, "enqueue", await store.enqueue(d)
                    case 1:
                        return (
                            tenant,
                            "claim",
                            await store.claim(thread_id, f"holder-{i}", 30, tenant=tenant),
                        )
                    case _:
                        checkpoint = kit.checkpoint(None, id=f"{thread_id}-cp{i}", tenant=tenant)
                        commit = Commit(token=0, checkpoint=checkpoint)
                        return (
                            tenant,
                            "claim_and_commit",
                            await store.claim_and_commit(thread_id, f"holder-{i}", 30, commit),
                        )
            except (TenantMismatch, ThreadBusy) as refused:
                return tenant, "refused", refused

        results = await asyncio.gather(
            *(attempt(thread_id, i) for thread_id in threads for i in range(12))
        )
        for n, thread_id in enumerate(threads):
            mine = results[n * 12 : (n + 1) * 12]
            snap = await kit.store.read(thread_id)
            assert snap is not None and snap.tenant_bound, snap
            winner = snap.tenant
            assert winner in ("alpha", "beta")
            for tenant, _, outcome in mine:
                if tenant != winner:
                    assert isinstance(outcome, TenantMismatch), (thread_id, tenant, outcome)
            won = [(op, outcome) for tenant, op, outcome in mine if tenant == winner]
            assert any(op != "refused" for op, _ in won), "the winner's first write applied"
            for op, outcome in won:
                assert op != "refused" or isinstance(outcome, ThreadBusy), outcome
            stored = await kit.store.list_dispatches(thread_id=thread_id)
            assert {d.tenant for d in stored} <= {winner}
            assert sorted(d.dispatch_id for d in stored) == sorted(
                outcome.dispatch_id for op, outcome in won if op == "enqueue"
            )
            history = await kit.store.checkpoints(thread_id)
            assert all(cp.tenant == winner for cp, _ in history)
