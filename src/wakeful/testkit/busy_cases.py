"""Conformance cases: busy threads (issue 36). Each thread has one run slot; a run's
dispatch enqueued while it is held waits ``queued`` and ``if_busy`` decides the rest."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest

from wakeful.errors import InvalidInput, StaleClaim, ThreadBusy
from wakeful.records import (
    Awaiting,
    Commit,
    Dispatch,
    Done,
    EventDraft,
    IfBusy,
    Lease,
    Retry,
    Settle,
)
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio

RUN_KINDS = ("start", "message")


def _run(kit: Kit, thread_id: str, dispatch_id: str, if_busy: IfBusy = "enqueue") -> Dispatch:
    d = kit.dispatch(thread_id, dispatch_id=dispatch_id, payload={"run_id": f"run-{dispatch_id}"})
    return msgspec.structs.replace(d, if_busy=if_busy)


async def _status(kit: Kit, dispatch_id: str) -> str:
    d = await kit.store.get_dispatch(dispatch_id)
    assert d is not None, dispatch_id
    return d.status


async def _only_lease(kit: Kit, thread_id: str | None = None) -> Lease:
    leases = await kit.store.claim_next("worker-a", 30, limit=10, thread_id=thread_id)
    assert len(leases) == 1, leases
    return leases[0]


async def _admitted_runs(kit: Kit, thread_id: str) -> list[str]:
    """The thread's run dispatches holding its run slot."""
    return [
        d.dispatch_id
        for d in await kit.store.list_dispatches(thread_id=thread_id, limit=1000)
        if d.kind in RUN_KINDS and d.status in ("pending", "leased", "awaiting", "quarantined")
    ]


class BusyCases(Harness):
    @case
    async def test_a_run_on_a_busy_thread_waits_queued_until_the_slot_frees(self, kit: Kit) -> None:
        first = await kit.store.enqueue(_run(kit, "t1", "d-1"))
        assert first.status == "pending" and first.queued_behind is None
        second = await kit.store.enqueue(_run(kit, "t1", "d-2"))
        third = await kit.store.enqueue(_run(kit, "t1", "d-3"))
        assert (second.status, second.queued_behind) == ("queued", "d-1")
        assert (third.status, third.queued_behind) == ("queued", "d-2")
        assert await kit.store.get_dispatch("d-2") == second
        queued = await kit.store.list_dispatches(status="queued")
        assert [d.dispatch_id for d in queued] == ["d-2", "d-3"]
        assert (await kit.store.queue_depths())["queued"] == 2
        # an idempotent retry of a queued submission returns it as stored
        assert await kit.store.enqueue(_run(kit, "t1", "d-2")) == second

        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == "d-1"
        await kit.store.release("t1", lease.claim.token)  # the claim ends, the run does not
        lease = await _only_lease(kit)  # its lapsed lease is taken over, never d-2
        assert lease.dispatch.dispatch_id == "d-1"
        await kit.store.settle("d-1", lease.claim.token, Retry(0, "again"))
        assert await _status(kit, "d-2") == "queued", "a retried run keeps its slot"
        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == "d-1"
        await kit.store.settle("d-1", lease.claim.token, Done())

        admitted = await kit.store.get_dispatch("d-2")
        assert admitted is not None and admitted.status == "pending"
        assert await _status(kit, "d-3") == "queued"
        assert (await _only_lease(kit)).dispatch.dispatch_id == "d-2"

    @case
    async def test_a_suspended_run_keeps_the_slot_and_its_resume_inherits_it(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(_run(kit, "t1", "d-1"))
        lease = await _only_lease(kit)
        await kit.store.settle("d-1", lease.claim.token, Awaiting())
        await kit.store.enqueue(_run(kit, "t1", "d-2"))
        assert await _status(kit, "d-2") == "queued"
        assert await kit.store.claim_next("worker-a", 30, limit=10) == []
        resume = await kit.store.enqueue(kit.dispatch("t1", dispatch_id="r-1", kind="resume"))
        assert resume.status == "pending"
        assert await _status(kit, "d-1") == "done"
        assert await _status(kit, "d-2") == "queued", "the resume inherits the slot"
        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == "r-1"
        await kit.store.settle("r-1", lease.claim.token, Done())
        assert (await _only_lease(kit)).dispatch.dispatch_id == "d-2"

    @case
    async def test_an_ending_commit_that_settles_the_run_admits_the_next(self, kit: Kit) -> None:
        kit.require("folded_writes")
        await kit.store.enqueue(_run(kit, "t1", "d-1"))
        await kit.store.enqueue(_run(kit, "t1", "c-2", "coalesce"))
        await kit.store.enqueue(_run(kit, "t1", "c-3", "coalesce"))
        lease = await _only_lease(kit)
        ending = Commit(
            token=lease.claim.token,
            events=(EventDraft(type="run.completed"),),
            settle=Settle(dispatch_id="d-1", outcome=Done()),
        )
        await kit.store.commit("t1", ending)
        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == "c-2" and lease.dispatch.coalesced == ("c-3",)
        merged = await kit.store.get_dispatch("c-3")
        assert merged is not None and (merged.status, merged.answered_by) == ("done", "c-2")

    @case
    async def test_reject_refuses_while_busy_and_stores_nothing(self, kit: Kit) -> None:
        idle = await kit.store.enqueue(_run(kit, "t1", "d-1", "reject"))
        assert idle.status == "pending" and idle.if_busy == "reject"
        with pytest.raises(ThreadBusy) as refused:
            await kit.store.enqueue(_run(kit, "t1", "d-2", "reject"))
        assert refused.value.dispatch_id == "d-1" and refused.value.run_id == "run-d-1"
        assert await kit.store.get_dispatch("d-2") is None
        await kit.store.enqueue(_run(kit, "t1", "d-3"))  # queued behind d-1
        lease = await _only_lease(kit)
        await kit.store.settle("d-1", lease.claim.token, Done())
        with pytest.raises(ThreadBusy) as refused:  # d-3 holds the slot now
            await kit.store.enqueue(_run(kit, "t1", "d-2", "reject"))
        assert refused.value.dispatch_id == "d-3"
        lease = await _only_lease(kit)
        await kit.store.settle("d-3", lease.claim.token, Done())
        accepted = await kit.store.enqueue(_run(kit, "t1", "d-2", "reject"))
        assert accepted.status == "pending"
        assert await kit.store.get_dispatch("d-2") == accepted

    @case
    async def test_interrupt_fences_the_busy_run_and_runs_after_its_cancellation(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(_run(kit, "t1", "d-1"))
        busy = await _only_lease(kit)
        new = await kit.store.enqueue(_run(kit, "t1", "d-2", "interrupt"))
        assert (new.status, new.queued_behind) == ("queued", "d-1")
        with pytest.raises(StaleClaim):  # fenced: its owner stops at its next write
            await kit.store.renew("t1", busy.claim.token, 30)
        with pytest.raises(StaleClaim):
            await kit.store.settle("d-1", busy.claim.token, Done())
        old = await kit.store.get_dispatch("d-1")
        assert old is not None and old.status == "done"
        assert old.last_error == "cancelled: interrupted by d-2"
        lease = await _only_lease(kit)
        assert lease.dispatch.kind == "cancel"
        assert lease.dispatch.payload == {
            "reason": "interrupted by d-2",
            "interrupted_by": "d-2",
        }
        assert await _status(kit, "d-2") == "queued", "the cancellation holds the slot"
        await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
        assert (await _only_lease(kit)).dispatch.dispatch_id == "d-2"

    @case
    async def test_rollback_fences_the_busy_run_with_an_intent_that_asks_for_the_rollback(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(_run(kit, "t1", "d-1"))
        busy = await _only_lease(kit)
        new = await kit.store.enqueue(_run(kit, "t1", "d-2", "rollback"))
        assert (new.status, new.queued_behind, new.if_busy) == ("queued", "d-1", "rollback")
        with pytest.raises(StaleClaim):
            await kit.store.renew("t1", busy.claim.token, 30)
        old = await kit.store.get_dispatch("d-1")
        assert old is not None and old.status == "done"
        assert old.last_error == "cancelled: rolled back by d-2"
        lease = await _only_lease(kit)
        assert lease.dispatch.kind == "cancel"
        assert lease.dispatch.payload == {
            "reason": "rolled back by d-2",
            "interrupted_by": "d-2",
            "rollback": True,
        }
        assert await _status(kit, "d-2") == "queued", "the rollback holds the slot"
        await kit.store.settle(lease.dispatch.dispatch_id, lease.claim.token, Done())
        assert (await _only_lease(kit)).dispatch.dispatch_id == "d-2"

    @case
    async def test_rollback_on_an_idle_thread_fences_nothing(self, kit: Kit) -> None:
        d = await kit.store.enqueue(_run(kit, "t1", "d-1", "rollback"))
        assert (d.status, d.if_busy) == ("pending", "rollback")
        assert [x.kind for x in await kit.store.list_dispatches(thread_id="t1")] == ["start"]

    @case
    async def test_interrupt_on_an_idle_thread_fences_nothing(self, kit: Kit) -> None:
        d = await kit.store.enqueue(_run(kit, "t1", "d-1", "interrupt"))
        assert d.status == "pending"
        assert [x.kind for x in await kit.store.list_dispatches(thread_id="t1")] == ["start"]

    @case
    async def test_coalesce_admits_consecutive_waiting_submissions_as_one_run(
        self, kit: Kit
    ) -> None:
        await kit.store.enqueue(_run(kit, "t1", "d-0"))
        busy = await _only_lease(kit)
        for name in ("c-1", "c-2", "c-3"):
            await kit.store.enqueue(_run(kit, "t1", name, "coalesce"))
        await kit.store.enqueue(_run(kit, "t1", "e-4"))
        await kit.store.enqueue(_run(kit, "t1", "c-5", "coalesce"))
        await kit.store.settle("d-0", busy.claim.token, Done())
        head = await kit.store.get_dispatch("c-1")
        assert head is not None and head.status == "pending"
        assert head.coalesced == ("c-2", "c-3")
        for name in ("c-2", "c-3"):
            merged = await kit.store.get_dispatch(name)
            assert merged is not None and (merged.status, merged.answered_by) == ("done", "c-1")
        assert await _status(kit, "e-4") == "queued"
        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == "c-1" and lease.dispatch.coalesced == ("c-2", "c-3")
        await kit.store.settle("c-1", lease.claim.token, Done())
        lease = await _only_lease(kit)  # an enqueue submission is never merged
        assert lease.dispatch.dispatch_id == "e-4" and lease.dispatch.coalesced == ()
        await kit.store.settle("e-4", lease.claim.token, Done())
        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == "c-5" and lease.dispatch.coalesced == ()

    @case
    async def test_cancel_keeps_the_queue_and_admits_its_head_once_settled(self, kit: Kit) -> None:
        await kit.store.enqueue(_run(kit, "t1", "d-1"))
        await kit.store.enqueue(_run(kit, "t1", "d-2"))
        cancel = await kit.store.cancel("t1", "stop")
        assert await _status(kit, "d-1") == "done"
        assert await _status(kit, "d-2") == "queued"
        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == cancel.dispatch_id
        await kit.store.settle(cancel.dispatch_id, lease.claim.token, Done())
        assert (await _only_lease(kit)).dispatch.dispatch_id == "d-2"

    @case
    async def test_purging_a_quarantined_holder_admits_the_next(self, kit: Kit) -> None:
        await kit.store.enqueue(msgspec.structs.replace(_run(kit, "t1", "d-1"), max_attempts=1))
        await kit.store.enqueue(_run(kit, "t1", "d-2"))
        lease = await _only_lease(kit)
        await kit.store.release("t1", lease.claim.token)
        await kit.store.quarantine("d-1")
        assert await _status(kit, "d-2") == "queued", "parked work keeps the slot"
        assert await kit.store.claim_next("worker-a", 30, limit=10) == []
        await kit.store.purge("d-1")
        assert (await _only_lease(kit)).dispatch.dispatch_id == "d-2"

    @case
    async def test_policies_a_store_cannot_honour_are_refused(self, kit: Kit) -> None:
        resume = msgspec.structs.replace(
            kit.dispatch("t1", dispatch_id="r-1", kind="resume"), if_busy="reject"
        )
        with pytest.raises(InvalidInput):
            await kit.store.enqueue(resume)
        with pytest.raises(InvalidInput):
            await kit.store.enqueue(msgspec.structs.replace(_run(kit, "t1", "d-2"), if_busy="x"))
        assert await kit.store.list_dispatches(thread_id="t1") == []

    @case
    async def test_busy_state_survives_a_reopen(self, kit: Kit) -> None:
        await kit.store.enqueue(_run(kit, "t1", "d-1"))
        await kit.store.enqueue(_run(kit, "t1", "c-2", "coalesce"))
        await kit.store.enqueue(_run(kit, "t1", "c-3", "coalesce"))
        store = await kit.reopen()
        assert await kit.store.get_dispatch("c-3") is not None
        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == "d-1"
        await store.settle("d-1", lease.claim.token, Done())
        lease = await _only_lease(kit)
        assert lease.dispatch.dispatch_id == "c-2" and lease.dispatch.coalesced == ("c-3",)

    @case
    async def test_concurrent_submitters_with_mixed_policies_admit_one_run_at_a_time(
        self, kit: Kit
    ) -> None:
        policies: tuple[IfBusy, ...] = ("enqueue", "reject", "interrupt", "coalesce", "rollback")
        accepted: dict[str, IfBusy] = {}
        rejected: list[str] = []

        async def submit(i: int) -> None:
            policy = policies[i % len(policies)]
            name = f"s-{i:02d}"
            try:
                await kit.store.enqueue(_run(kit, "t1", name, policy))
                accepted[name] = policy
            except ThreadBusy:
                rejected.append(name)

        runs: dict[str, int] = {}
        for wave in range(3):
            await asyncio.gather(*(submit(wave * 8 + i) for i in range(8)))
            assert len(await _admitted_runs(kit, "t1")) <= 1
            # drain the wave like a worker would: one lease at a time, settled done
            for _ in range(40):
                leases = await kit.store.claim_next("worker-a", 30, limit=10)
                if not leases:
                    break
                assert len(leases) == 1
                d = leases[0].dispatch
                if d.kind != "cancel":
                    runs[d.dispatch_id] = runs.get(d.dispatch_id, 0) + 1
                assert len(await _admitted_runs(kit, "t1")) <= 1
                with contextlib.suppress(StaleClaim):  # interrupted: its cancel is next
                    await kit.store.settle(d.dispatch_id, leases[0].claim.token, Done())
                assert len(await _admitted_runs(kit, "t1")) <= 1
        assert accepted and rejected, (accepted, rejected)
        for name in rejected:
            assert await kit.store.get_dispatch(name) is None
        stored = {d.dispatch_id: d for d in await kit.store.list_dispatches(limit=1000)}
        for name, policy in accepted.items():
            d = stored[name]
            assert d.status == "done", d
            assert runs.get(name, 0) <= 1, "no submission ran twice"
            if d.answered_by is not None:  # coalesced into the run of another submission
                assert policy == "coalesce" and name not in runs
                assert runs[d.answered_by] == 1 and name in stored[d.answered_by].coalesced
            elif not (d.last_error or "").startswith(
                ("cancelled: interrupted by", "cancelled: rolled back by")
            ):
                assert runs.get(name) == 1, d  # ran (it was interrupted or rolled back otherwise)
        assert all(runs.get(s, 0) == 0 for s in rejected)


__all__ = ["BusyCases"]
