"""Conformance cases: learning an operation's outcome after the claim was lost.

``operation(thread_id, operation_id)`` answers with the original receipt of an applied
commit whoever holds the thread now, or ``None``; a retry refused as ``StaleClaim`` carries
the receipt (``applied_receipt``) when its operation was applied with the same payload."""

from __future__ import annotations

import pytest

from wakeful.errors import OperationConflict, StaleClaim
from wakeful.records import Commit, EventDraft, Message, Receipt, RetentionPolicy
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


async def _applied_then_taken_over(kit: Kit, operation_id: str) -> tuple[Commit, Receipt]:
    """A commit applied by holder-a, whose claim then expired and was taken over."""
    claim, first = await kit.started("t1")
    commit = Commit(
        token=claim.token,
        operation_id=operation_id,
        checkpoint=kit.checkpoint(first.checkpoint_id),
        events=(EventDraft(type="step"),),
        messages=(Message(id="m1", role="assistant", content="done"),),
    )
    receipt = await kit.store.commit("t1", commit)
    await kit.advance(31)
    await kit.store.claim("t1", "holder-b", 30)
    return commit, receipt


class OperationCases(Harness):
    @case
    async def test_a_retry_after_a_takeover_learns_that_its_operation_was_applied(
        self, kit: Kit
    ) -> None:
        commit, receipt = await _applied_then_taken_over(kit, "run-1:applied")
        before = await kit.store.read("t1")
        with pytest.raises(StaleClaim) as refused:
            await kit.store.commit("t1", commit)
        assert refused.value.applied_receipt == receipt
        assert "this operation was applied before the claim was lost" in str(refused.value)
        assert await kit.store.read("t1") == before, "the token stays first: nothing changed"
        assert await kit.store.operation("t1", "run-1:applied") == receipt
        other = await kit.sibling()
        assert await other.operation("t1", "run-1:applied") == receipt
        assert await (await kit.reopen()).operation("t1", "run-1:applied") == receipt

    @case
    async def test_an_operation_never_applied_reads_as_none(self, kit: Kit) -> None:
        claim, first = await kit.started("t1")
        assert await kit.store.operation("t1", "run-1:never") is None
        assert await kit.store.operation("unknown-thread", "run-1:never") is None
        await kit.advance(31)
        await kit.store.claim("t1", "holder-b", 30)
        lost = Commit(
            token=claim.token,
            operation_id="run-1:never",
            checkpoint=kit.checkpoint(first.checkpoint_id),
        )
        with pytest.raises(StaleClaim) as refused:
            await kit.store.commit("t1", lost)
        assert refused.value.applied_receipt is None
        assert "was applied" not in str(refused.value)
        assert await kit.store.operation("t1", "run-1:never") is None
        snap = await kit.store.read("t1")
        assert snap is not None and snap.version == 1

    @case
    async def test_another_payload_under_an_applied_operation_id_is_refused_as_before(
        self, kit: Kit
    ) -> None:
        commit, receipt = await _applied_then_taken_over(kit, "run-1:reused")
        other = Commit(
            token=commit.token, operation_id="run-1:reused", events=(EventDraft(type="other"),)
        )
        with pytest.raises(StaleClaim) as refused:
            await kit.store.commit("t1", other)
        assert refused.value.applied_receipt is None, "another payload is another operation"
        successor = await kit.store.read("t1")
        assert successor is not None and successor.claim is not None
        with pytest.raises(OperationConflict):
            await kit.store.commit(
                "t1",
                Commit(
                    token=successor.claim.token,
                    operation_id="run-1:reused",
                    events=other.events,
                ),
            )
        assert await kit.store.operation("t1", "run-1:reused") == receipt
        assert await kit.store.read("t1") == successor

    @case
    async def test_operation_records_are_per_thread_kept_by_compaction_gone_with_delete_and_prune(
        self, kit: Kit
    ) -> None:
        claim, _ = await kit.started("t1")
        receipt = await kit.store.commit(
            "t1",
            Commit(token=claim.token, operation_id="op-x", events=(EventDraft(type="e"),)),
        )
        assert receipt.events and receipt.operation_id == "op-x"
        assert await kit.store.operation("t2", "op-x") is None, "operation ids are per thread"
        assert await kit.store.compact_events("t1", receipt.events[-1] + 1) > receipt.events[-1]
        assert await kit.store.operation("t1", "op-x") == receipt, "compaction keeps receipts"
        await kit.store.delete_thread("t1")
        assert await kit.store.operation("t1", "op-x") is None
        claim, _ = await kit.started("t3")
        kept = await kit.store.commit(
            "t3", Commit(token=claim.token, operation_id="op-y", events=(EventDraft(type="e"),))
        )
        assert await kit.store.operation("t3", "op-y") == kept
        await kit.advance(100)
        report = await kit.store.prune(RetentionPolicy(receipt_max_age=50))
        assert report.receipts == 1
        assert await kit.store.operation("t3", "op-y") is None
