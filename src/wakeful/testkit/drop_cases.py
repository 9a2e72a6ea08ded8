"""Conformance cases: ``Commit.drop_checkpoints`` (a caller's own retention, in a commit)."""

from __future__ import annotations

import pytest

from wakeful.errors import InvalidCommit, InvalidInput, StaleClaim
from wakeful.records import Checkpoint, Claim, Commit, EventDraft, RetentionPolicy
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


async def _history(kit: Kit, thread_id: str) -> list[str]:
    return [cp.id for cp, _ in await kit.store.checkpoints(thread_id)]


async def _chain(kit: Kit, thread_id: str, length: int) -> tuple[Claim, list[Checkpoint]]:
    """A claimed thread with ``length`` checkpoints, oldest first."""
    claim = await kit.claimed(thread_id)
    chain: list[Checkpoint] = []
    for _ in range(length):
        cp = kit.checkpoint(chain[-1].id if chain else None)
        await kit.store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        chain.append(cp)
    return claim, chain


class DropCases(Harness):
    @case
    async def test_drop_removes_named_history_atomically_with_the_new_checkpoint(
        self, kit: Kit
    ) -> None:
        claim, chain = await _chain(kit, "t1", 4)
        survivor = kit.checkpoint(chain[-1].id)
        receipt = await kit.store.commit(
            "t1",
            Commit(
                token=claim.token,
                checkpoint=survivor,
                drop_checkpoints=(chain[0].id, chain[2].id),
                events=(EventDraft(type="compacted"),),
            ),
        )
        assert receipt.version == 5
        assert await _history(kit, "t1") == [survivor.id, chain[3].id, chain[1].id]
        page = await kit.store.checkpoints("t1", before=chain[3].id, limit=5)
        assert [cp.id for cp, _ in page] == [chain[1].id]
        reopened = await kit.reopen()
        assert [cp.id for cp, _ in await reopened.checkpoints("t1")] == [
            survivor.id,
            chain[3].id,
            chain[1].id,
        ]

    @case
    async def test_drop_without_a_new_checkpoint_keeps_the_latest(self, kit: Kit) -> None:
        claim, chain = await _chain(kit, "t1", 3)
        await kit.store.commit(
            "t1", Commit(token=claim.token, drop_checkpoints=(chain[0].id, chain[1].id))
        )
        assert await _history(kit, "t1") == [chain[2].id]
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint == chain[2] and snap.version == 4

    @case
    async def test_dropping_the_latest_or_an_unknown_id_is_refused_and_changes_nothing(
        self, kit: Kit
    ) -> None:
        claim, chain = await _chain(kit, "t1", 2)
        for drop in ((chain[1].id,), (chain[0].id, "cp-unknown")):
            with pytest.raises(InvalidCommit):
                await kit.store.commit(
                    "t1",
                    Commit(
                        token=claim.token, drop_checkpoints=drop, events=(EventDraft(type="x"),)
                    ),
                )
        newer = kit.checkpoint(chain[1].id)
        with pytest.raises(InvalidCommit):
            await kit.store.commit(
                "t1", Commit(token=claim.token, checkpoint=newer, drop_checkpoints=(newer.id,))
            )
        with pytest.raises(InvalidInput):
            await kit.store.commit(
                "t1", Commit(token=claim.token, drop_checkpoints=(chain[0].id, chain[0].id))
            )
        assert await _history(kit, "t1") == [chain[1].id, chain[0].id]
        snap = await kit.store.read("t1")
        assert snap is not None and snap.version == 2 and snap.last_seq == 0

    @case
    async def test_a_stale_token_cannot_drop(self, kit: Kit) -> None:
        claim, chain = await _chain(kit, "t1", 2)
        await kit.store.release("t1", claim.token)
        await kit.claimed("t1", holder="holder-b")
        with pytest.raises(StaleClaim):
            await kit.store.commit("t1", Commit(token=claim.token, drop_checkpoints=(chain[0].id,)))
        assert await _history(kit, "t1") == [chain[1].id, chain[0].id]

    @case
    async def test_a_retried_dropping_operation_returns_its_receipt(self, kit: Kit) -> None:
        claim, chain = await _chain(kit, "t1", 3)
        commit = Commit(token=claim.token, operation_id="op-drop", drop_checkpoints=(chain[0].id,))
        first = await kit.store.commit("t1", commit)
        again = await kit.store.commit("t1", commit)
        assert again == first
        assert await _history(kit, "t1") == [chain[2].id, chain[1].id]

    @case
    async def test_count_retention_counts_what_drops_left(self, kit: Kit) -> None:
        claim, chain = await _chain(kit, "t1", 6)
        await kit.store.commit(
            "t1", Commit(token=claim.token, drop_checkpoints=(chain[3].id, chain[4].id))
        )
        await kit.store.prune(RetentionPolicy(keep_checkpoints=3))
        assert await _history(kit, "t1") == [chain[5].id, chain[2].id, chain[1].id]
