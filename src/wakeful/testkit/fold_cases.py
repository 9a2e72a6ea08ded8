"""Conformance cases: writes folded into one atomic step (``Commit.release``,
``Commit.settle`` and ``claim_and_commit``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from wakeful.errors import (
    InvalidCommit,
    NotFound,
    OperationConflict,
    StaleClaim,
    ThreadBusy,
    VersionConflict,
)
from wakeful.records import (
    Awaiting,
    Commit,
    Done,
    EventDraft,
    Lease,
    Retry,
    Settle,
)
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


async def _lease(kit: Kit, thread_id: str, dispatch_id: str) -> Lease:
    await kit.store.enqueue(kit.dispatch(thread_id, dispatch_id=dispatch_id))
    leases = await kit.store.claim_next("worker-a", 30)
    assert [lease.dispatch.dispatch_id for lease in leases] == [dispatch_id]
    return leases[0]


class FoldCases(Harness):
    # ------------------------------------------------------------ release

    @case
    async def test_release_ends_the_claim_with_the_commit(self, kit: Kit) -> None:
        kit.require("folded_writes")
        claim, first = await kit.started("t1")
        final = kit.checkpoint(first.checkpoint_id, status="completed")
        receipt = await kit.store.commit(
            "t1",
            Commit(
                token=claim.token,
                checkpoint=final,
                events=(EventDraft(type="done"),),
                operation_id="op-final",
                release=True,
            ),
        )
        assert receipt.version == 2 and receipt.events == (2,)
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim is None and snap.checkpoint == final
        # the thread is free at once: no waiting for expiry
        successor = await kit.store.claim("t1", "holder-b", 30)
        assert successor.token > claim.token

    @case
    async def test_a_released_commit_answers_its_retries_until_a_new_claim(self, kit: Kit) -> None:
        kit.require("folded_writes")
        claim, first = await kit.started("t1")
        commit = Commit(
            token=claim.token,
            checkpoint=kit.checkpoint(first.checkpoint_id, status="completed"),
            events=(EventDraft(type="done"),),
            operation_id="op-final",
            release=True,
        )
        receipt = await kit.store.commit("t1", commit)
        assert await kit.store.commit("t1", commit) == receipt
        reopened = await kit.reopen()
        assert await reopened.commit("t1", commit) == receipt
        # another payload under the ended claim is refused, and so is an unkeyed commit
        other = Commit(token=claim.token, events=(EventDraft(type="x"),), operation_id="op-other")
        with pytest.raises(StaleClaim):
            await reopened.commit("t1", other)
        with pytest.raises(StaleClaim):
            await reopened.commit("t1", Commit(token=claim.token, events=(EventDraft(type="y"),)))
        changed = Commit(
            token=claim.token,
            checkpoint=kit.checkpoint(first.checkpoint_id, status="failed"),
            operation_id="op-final",
            release=True,
        )
        with pytest.raises(StaleClaim):
            await reopened.commit("t1", changed)
        # once a newer claim exists the old token is fenced, retries included
        await reopened.claim("t1", "holder-b", 30)
        with pytest.raises(StaleClaim):
            await reopened.commit("t1", commit)
        snap = await reopened.read("t1")
        assert snap is not None and snap.version == 2 and snap.last_seq == 2

    @case
    async def test_a_refused_releasing_commit_keeps_the_claim(self, kit: Kit) -> None:
        kit.require("folded_writes")
        claim, _first = await kit.started("t1")
        with pytest.raises(VersionConflict):
            await kit.store.commit(
                "t1", Commit(token=claim.token, expected_version=0, release=True)
            )
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim is not None and snap.claim.token == claim.token
        with pytest.raises(ThreadBusy):
            await kit.store.claim("t1", "holder-b", 30)

    # ------------------------------------------------------------- settle

    @case
    async def test_settle_done_with_the_final_commit(self, kit: Kit) -> None:
        kit.require("folded_writes")
        lease = await _lease(kit, "t1", "d-1")
        token = lease.claim.token
        final = kit.checkpoint(None, status="completed")
        commit = Commit(
            token=token,
            checkpoint=final,
            events=(EventDraft(type="done"),),
            operation_id="op-final",
            settle=Settle(dispatch_id="d-1", outcome=Done()),
        )
        receipt = await kit.store.commit("t1", commit)
        d = await kit.store.get_dispatch("d-1")
        assert d is not None and d.status == "done" and d.attempts == 1
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim is None and snap.checkpoint == final
        # a retry answers with the receipt and changes nothing
        assert await kit.store.commit("t1", commit) == receipt
        reopened = await kit.reopen()
        assert await reopened.commit("t1", commit) == receipt
        again = await reopened.get_dispatch("d-1")
        assert again is not None and again.status == "done"
        with pytest.raises(StaleClaim):
            await reopened.settle("d-1", token, Done())
        assert await reopened.claim_next("worker-b", 30) == []

    @case
    async def test_settle_awaiting_and_retry_with_a_commit(self, kit: Kit) -> None:
        kit.require("folded_writes")
        lease = await _lease(kit, "t1", "d-1")
        await kit.store.commit(
            "t1",
            Commit(
                token=lease.claim.token,
                checkpoint=kit.checkpoint(None, status="suspended"),
                settle=Settle(dispatch_id="d-1", outcome=Awaiting()),
            ),
        )
        parked = await kit.store.get_dispatch("d-1")
        assert parked is not None and parked.status == "awaiting"
        lease2 = await _lease(kit, "t2", "d-2")
        before = await kit.now()
        await kit.store.commit(
            "t2",
            Commit(
                token=lease2.claim.token,
                events=(EventDraft(type="failed-attempt"),),
                settle=Settle(dispatch_id="d-2", outcome=Retry(60, "boom")),
            ),
        )
        retried = await kit.store.get_dispatch("d-2")
        assert retried is not None and retried.status == "scheduled"  # its backoff (issue 38)
        assert retried.token is None and retried.last_error == "boom"
        assert retried.available_at is not None
        assert retried.available_at >= before + timedelta(seconds=59)
        snap = await kit.store.read("t2")
        assert snap is not None and snap.claim is None and snap.last_seq == 1
        assert await kit.store.claim_next("worker-b", 30) == []

    @case
    async def test_a_refused_settle_refuses_the_whole_commit(self, kit: Kit) -> None:
        kit.require("folded_writes")
        lease = await _lease(kit, "t1", "d-1")
        token = lease.claim.token
        other = await _lease(kit, "t2", "d-2")
        attempts = [
            (Settle(dispatch_id="d-missing", outcome=Done()), NotFound),
            (Settle(dispatch_id="d-2", outcome=Done()), InvalidCommit),
        ]
        for settle, error in attempts:
            with pytest.raises(error):
                await kit.store.commit(
                    "t1",
                    Commit(token=token, events=(EventDraft(type="lost"),), settle=settle),
                )
        await kit.store.settle("d-1", token, Retry(0, "again"))
        # settled already (and the claim ended with it): the commit is stale
        with pytest.raises(StaleClaim):
            await kit.store.commit(
                "t1",
                Commit(
                    token=token,
                    events=(EventDraft(type="lost"),),
                    settle=Settle(dispatch_id="d-1", outcome=Done()),
                ),
            )
        for tid in ("t1", "t2"):
            snap = await kit.store.read(tid)
            assert snap is None or (snap.last_seq == 0 and snap.version == 0)
        held = await kit.store.get_dispatch("d-2")
        assert held is not None and held.status == "leased" and held.token == other.claim.token

    @case
    async def test_settle_after_a_takeover_is_stale(self, kit: Kit) -> None:
        kit.require("folded_writes")
        lease = await _lease(kit, "t1", "d-1")
        await kit.advance(31)
        taken = await kit.store.claim_next("worker-b", 30)
        assert [x.dispatch.dispatch_id for x in taken] == ["d-1"]
        with pytest.raises(StaleClaim):
            await kit.store.commit(
                "t1",
                Commit(
                    token=lease.claim.token,
                    checkpoint=kit.checkpoint(None, status="completed"),
                    settle=Settle(dispatch_id="d-1", outcome=Done()),
                ),
            )
        d = await kit.store.get_dispatch("d-1")
        assert d is not None and d.status == "leased" and d.token == taken[0].claim.token
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint is None

    # --------------------------------------------------- claim_and_commit

    @case
    async def test_claim_and_commit_admits_in_one_step(self, kit: Kit) -> None:
        kit.require("folded_writes")
        cp = kit.checkpoint(None)
        claim, receipt = await kit.store.claim_and_commit(
            "t1",
            "holder-a",
            30,
            Commit(token=0, checkpoint=cp, events=(EventDraft(type="started"),)),
        )
        assert claim.holder == "holder-a" and claim.token >= 1
        assert receipt.version == 1 and receipt.checkpoint_id == cp.id and receipt.events == (1,)
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint == cp
        assert snap.claim is not None and snap.claim.token == claim.token
        assert snap.claim.holder == "holder-a"
        nxt = await kit.store.commit(
            "t1", Commit(token=claim.token, checkpoint=kit.checkpoint(cp.id))
        )
        assert nxt.version == 2
        with pytest.raises(ThreadBusy):
            await kit.store.claim_and_commit("t1", "holder-b", 30, Commit(token=0))
        reopened = await kit.reopen()
        again = await reopened.read("t1")
        assert again is not None and again.version == 2
        assert again.claim is not None and again.claim.token == claim.token

    @case
    async def test_a_refused_claim_and_commit_spends_no_token(self, kit: Kit) -> None:
        kit.require("folded_writes")
        claim, first = await kit.started("t1")
        await kit.store.release("t1", claim.token)
        stale_parent = kit.checkpoint(None)
        refusals = [
            (Commit(token=0, expected_version=0), VersionConflict),
            (Commit(token=0, checkpoint=stale_parent), VersionConflict),
            (Commit(token=0, consume=("nothing",)), InvalidCommit),
        ]
        for commit, error in refusals:
            with pytest.raises(error):
                await kit.store.claim_and_commit("t1", "holder-b", 30, commit)
            snap = await kit.store.read("t1")
            assert snap is not None and snap.claim is None and snap.version == 1
        granted, receipt = await kit.store.claim_and_commit(
            "t1",
            "holder-b",
            30,
            Commit(token=0, expected_version=1, checkpoint=kit.checkpoint(first.checkpoint_id)),
        )
        assert granted.token == claim.token + 1, "a refused claim_and_commit spent a token"
        assert receipt.version == 2

    @case
    async def test_claim_and_commit_takes_over_an_expired_claim(self, kit: Kit) -> None:
        kit.require("folded_writes")
        claim, first = await kit.started("t1")
        await kit.advance(31)
        granted, receipt = await kit.store.claim_and_commit(
            "t1",
            "holder-b",
            30,
            Commit(token=0, checkpoint=kit.checkpoint(first.checkpoint_id), operation_id="adm"),
        )
        assert granted.token > claim.token and receipt.version == 2
        with pytest.raises(StaleClaim):
            await kit.store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="x"),)))

    @case
    async def test_claim_and_commit_replays_a_recorded_operation(self, kit: Kit) -> None:
        kit.require("folded_writes")
        cp = kit.checkpoint(None)
        commit = Commit(token=0, checkpoint=cp, operation_id="admit-1", release=True)
        first_claim, receipt = await kit.store.claim_and_commit("t1", "holder-a", 30, commit)
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim is None, "release inside claim_and_commit"
        claim, replayed = await kit.store.claim_and_commit("t1", "holder-a", 30, commit)
        assert replayed == receipt and claim.token > first_claim.token
        snap = await kit.store.read("t1")
        assert snap is not None and snap.version == 1
        assert snap.claim is not None and snap.claim.token == claim.token
        await kit.store.release("t1", claim.token)
        with pytest.raises(OperationConflict):
            await kit.store.claim_and_commit(
                "t1", "holder-a", 30, Commit(token=0, operation_id="admit-1")
            )
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim is None
