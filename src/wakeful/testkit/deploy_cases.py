"""Conformance cases: deploys in the middle of runs (issue 40). A worker registers the code
version it runs."""

from __future__ import annotations

import pytest

from wakeful.errors import InvalidInput, InvalidState, NotFound
from wakeful.records import Awaiting, Commit, Done, EventDraft, Retry
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


class DeployCases(Harness):
    @case
    async def test_the_registry_lists_each_incarnations_version(self, kit: Kit) -> None:
        await kit.store.register_worker("w-1", version="2026-12-07.1")
        await kit.store.register_worker("w-2")
        listed = {w.worker_id: w.version for w in await kit.store.list_workers()}
        assert listed == {"w-1": "2026-12-07.1", "w-2": None}
        redeployed = await kit.store.register_worker("w-1", version="2026-12-07.2")
        await kit.store.heartbeat(redeployed)
        stopped = await kit.store.retire_worker(redeployed)
        assert stopped.version == "2026-12-07.2"
        reopened = {w.worker_id: w.version for w in await (await kit.reopen()).list_workers()}
        assert reopened == {"w-1": "2026-12-07.2", "w-2": None}, "a new registration replaces it"
        with pytest.raises(InvalidInput):
            await kit.store.register_worker("w-3", version="not a version")

    @case
    async def test_a_continuation_stays_with_its_version_until_the_pin_grace(
        self, kit: Kit
    ) -> None:
        await kit.store.register_worker("w-old", version="v1")
        new = await kit.store.register_worker("w-new", version="v2")
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="retried"))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="suspended"))
        leased = await kit.store.claim_next("w-old", 30, 2, version="v1")
        assert sorted(lease.dispatch.dispatch_id for lease in leased) == ["retried", "suspended"]
        assert {lease.dispatch.pinned_version for lease in leased} == {"v1"}, "the first lease pins"
        by_id = {lease.dispatch.dispatch_id: lease for lease in leased}
        await kit.store.settle("retried", by_id["retried"].claim.token, Retry(0.0, "crashed"))
        await kit.store.settle("suspended", by_id["suspended"].claim.token, Awaiting())
        resume = await kit.store.enqueue(kit.dispatch("t2", dispatch_id="answer", kind="resume"))
        assert resume.pinned_version == "v1", "a resume continues its run's version"
        # while a v1 worker is alive, neither a v2 worker nor one without version takes them
        assert await kit.store.claim_next("w-new", 30, 10, version="v2") == []
        assert await kit.store.claim_next("w-none", 30, 10) == []
        await kit.store.cancel("t3", "nothing there")
        (cancel,) = await kit.store.claim_next("w-new", 30, 10, version="v2")
        assert cancel.dispatch.kind == "cancel" and cancel.dispatch.pinned_version is None
        await kit.store.settle(cancel.dispatch.dispatch_id, cancel.claim.token, Done())
        await kit.advance(40)
        await kit.store.heartbeat(new)
        assert await kit.store.release_pins(60) == [], "v1 was alive 40 s ago"
        await kit.advance(21)
        await kit.store.heartbeat(new)
        released = await kit.store.release_pins(60)
        assert sorted(d.dispatch_id for d in released) == ["answer", "retried"]
        assert {(d.pinned_version, d.released_from) for d in released} == {(None, "v1")}
        assert await kit.store.release_pins(60) == [], "released once"
        reopened = await kit.reopen()
        kept = await reopened.get_dispatch("retried")
        assert kept is not None and (kept.pinned_version, kept.released_from) == (None, "v1")
        taken = await kit.store.claim_next("w-new", 30, 10, version="v2")
        assert sorted(lease.dispatch.dispatch_id for lease in taken) == ["answer", "retried"]
        assert {lease.dispatch.pinned_version for lease in taken} == {"v2"}
        assert {lease.dispatch.released_from for lease in taken} == {"v1"}

    @case
    async def test_a_lapsed_lease_is_recovered_by_its_version_only(self, kit: Kit) -> None:
        await kit.store.register_worker("w-old", version="v1")
        await kit.store.register_worker("w-new", version="v2")
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="crashed"))
        (first,) = await kit.store.claim_next("w-old", 10, version="v1")
        await kit.advance(11)  # its worker died: the lease lapses
        assert await kit.store.claim_next("w-new", 10, version="v2") == []
        (again,) = await kit.store.claim_next("w-old-2", 10, version="v1")
        assert again.dispatch.dispatch_id == "crashed" and again.dispatch.attempts == 2
        assert again.claim.token > first.claim.token

    @case
    async def test_a_draining_worker_takes_only_work_pinned_to_it(self, kit: Kit) -> None:
        await kit.store.register_worker("w-old", version="v1")
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="pinned"))
        (lease,) = await kit.store.claim_next("w-old", 30, version="v1")
        await kit.store.settle("pinned", lease.claim.token, Retry(0.0, "again"))
        await kit.store.enqueue(kit.dispatch("t2", dispatch_id="start", priority=5))
        drained = await kit.store.claim_next("w-old", 30, 10, version="v1", take_starts=False)
        assert [d.dispatch.dispatch_id for d in drained] == ["pinned"]
        on_thread = await kit.store.claim_next(
            "w-old", 30, version="v1", take_starts=False, thread_id="t2"
        )
        assert on_thread == []

    @case
    async def test_a_released_dispatch_can_be_held_and_requeued(self, kit: Kit) -> None:
        await kit.store.register_worker("w-old", version="v1")
        await kit.store.enqueue(kit.dispatch("t1", dispatch_id="d"))
        (lease,) = await kit.store.claim_next("w-old", 30, version="v1")
        await kit.store.settle("d", lease.claim.token, Retry(0.0, "again"))
        with pytest.raises(InvalidState):
            await kit.store.quarantine("d")  # neither exhausted nor released
        await kit.advance(61)
        assert len(await kit.store.release_pins(60)) == 1
        held = await kit.store.quarantine("d")
        assert held.status == "quarantined" and held.released_from == "v1"
        requeued = await kit.store.requeue("d")
        assert requeued.status == "pending" and requeued.released_from is None

    @case
    async def test_an_operator_moves_the_runs_of_a_version_to_another(self, kit: Kit) -> None:
        await kit.store.register_worker("w-old", version="v1")
        await kit.store.register_worker("w-new", version="v2")
        await kit.store.register_worker("w-other", version="v3")
        await kit.store.enqueue(kit.dispatch("t-lapsed", dispatch_id="lapsed"))
        (lapsing,) = await kit.store.claim_next("w-old", 10, version="v1")
        for tid in ("suspended", "retried", "running"):
            await kit.store.enqueue(kit.dispatch(f"t-{tid}", dispatch_id=tid))
        held = {
            lease.dispatch.dispatch_id: lease
            for lease in await kit.store.claim_next("w-old", 300, 3, version="v1")
        }
        assert len(held) == 3 and lapsing.dispatch.pinned_version == "v1"
        await kit.store.enqueue(kit.dispatch("t-v3", dispatch_id="other"))
        await kit.store.claim_next("w-other", 300, version="v3")
        suspend = Commit(
            token=held["suspended"].claim.token,
            checkpoint=kit.checkpoint(None, run_id="run-s", status="suspended"),
            events=(EventDraft(type="run.suspended", run_id="run-s"),),
        )
        await kit.store.commit("t-suspended", suspend)
        await kit.store.settle("suspended", held["suspended"].claim.token, Awaiting())
        await kit.store.settle("retried", held["retried"].claim.token, Retry(0.0, "again"))
        await kit.advance(11)  # "lapsed" lost its worker; "running" is still held
        with pytest.raises(InvalidInput):
            await kit.store.migrate_runs("v1", "v1")
        with pytest.raises(NotFound):
            await kit.store.migrate_runs("v1", "v9")  # no worker runs v9
        first = await kit.store.migrate_runs("v1", "v2", limit=1)
        assert [d.dispatch_id for d in first] == ["lapsed"], "oldest first, bounded"
        rest = await kit.store.migrate_runs("v1", "v2", limit=10)
        assert sorted(d.dispatch_id for d in rest) == ["retried", "suspended"]
        assert {(d.pinned_version, d.released_from) for d in first + rest} == {("v2", None)}
        assert await kit.store.migrate_runs("v1", "v2") == [], "nothing left to move"
        running = await kit.store.get_dispatch("running")
        other = await kit.store.get_dispatch("other")
        assert running is not None and running.pinned_version == "v1", "a held lease stays"
        assert other is not None and other.pinned_version == "v3"
        events = await kit.store.events_after("t-suspended", 0, 100)
        assert [e.type for e in events] == ["run.suspended", "run.migrated"]
        moved = events[-1]
        assert moved.run_id == "run-s" and moved.seq == 2
        assert moved.data == {
            "from": "v1",
            "to": "v2",
            "dispatch_id": "suspended",
            "run_id": "run-s",
        }
        (lapsed_event,) = await kit.store.events_after("t-lapsed", 0, 100)
        assert lapsed_event.type == "run.migrated" and lapsed_event.run_id is None
        # v1's workers no longer get them; v2's do, and a resume follows the suspended run
        assert await kit.store.claim_next("w-old", 30, 10, version="v1") == []
        taken = await kit.store.claim_next("w-new", 30, 10, version="v2")
        assert sorted(lease.dispatch.dispatch_id for lease in taken) == ["lapsed", "retried"]
        answer = kit.dispatch("t-suspended", dispatch_id="answer", kind="resume")
        assert (await kit.store.enqueue(answer)).pinned_version == "v2"
        reopened = await kit.reopen()
        kept = await reopened.events_after("t-suspended", 0, 100)
        assert [e.type for e in kept] == ["run.suspended", "run.migrated"]
        assert kept[-1].data == moved.data
        snap = await reopened.read("t-suspended")
        assert snap is not None and snap.last_seq == 2
