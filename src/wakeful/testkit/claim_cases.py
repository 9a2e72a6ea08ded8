"""Conformance cases: claims, fencing, takeover, reopen and waiting for events."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import pytest

from wakeful.errors import StaleClaim, ThreadBusy, VersionConflict
from wakeful.records import Claim, Commit, EventDraft, PendingWrite
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


class ClaimCases(Harness):
    @case
    async def test_claim_expiry_is_exact(self, kit: Kit) -> None:
        before = await kit.now()
        claim = await kit.store.claim("t1", "holder-a", 12.5)
        assert claim.thread_id == "t1" and claim.holder == "holder-a" and claim.token >= 1
        if kit.exact_expiry:
            assert claim.expires_at == before + timedelta(seconds=12.5)
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim == claim and snap.checkpoint is None

    @case
    async def test_claim_refused_while_live_even_for_the_same_holder(self, kit: Kit) -> None:
        claim = await kit.claimed("t1", "holder-a")
        for who in ("holder-a", "holder-b"):
            with pytest.raises(ThreadBusy) as busy:
                await kit.store.claim("t1", who, 30)
            assert busy.value.holder == "holder-a"
            assert busy.value.checkpoint_id is None
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim == claim

    @case
    async def test_busy_names_the_latest_checkpoint(self, kit: Kit) -> None:
        _, receipt = await kit.started("t1", "holder-a")
        with pytest.raises(ThreadBusy) as busy:
            await kit.store.claim("t1", "holder-b", 30)
        assert busy.value.holder == "holder-a"
        assert busy.value.checkpoint_id == receipt.checkpoint_id

    @case
    async def test_claim_is_live_until_its_expiry(self, kit: Kit) -> None:
        await kit.store.claim("t1", "holder-a", 10)
        await kit.advance(10 - 0.001)
        with pytest.raises(ThreadBusy):
            await kit.store.claim("t1", "holder-b", 10)
        await kit.advance(0.002)
        taken = await kit.store.claim("t1", "holder-b", 10)
        assert taken.holder == "holder-b"

    @case
    async def test_takeover_after_expiry_fences_the_old_holder(self, kit: Kit) -> None:
        old, first = await kit.started("t1", "holder-a")
        await kit.advance(31)
        new = await kit.store.claim("t1", "holder-b", 30)
        assert new.token > old.token
        cp = first.checkpoint_id
        assert cp is not None
        attempts = [
            Commit(token=old.token, checkpoint=kit.checkpoint(cp)),
            Commit(
                token=old.token,
                writes=(PendingWrite(checkpoint_id=cp, task_id="x", node="n", value=1),),
            ),
            Commit(token=old.token, events=(EventDraft(type="late"),)),
        ]
        for attempt in attempts:
            with pytest.raises(StaleClaim) as stale:
                await kit.store.commit("t1", attempt)
            assert stale.value.token == old.token and stale.value.current == new.token
        with pytest.raises(StaleClaim):
            await kit.store.renew("t1", old.token, 30)
        await kit.store.release("t1", old.token)
        snap = await kit.store.read("t1")
        assert snap is not None
        assert snap.claim == new and snap.version == 1 and snap.writes == ()
        assert [e.type for e in await kit.store.events_after("t1")] == ["started"]

    @case
    async def test_token_is_checked_before_the_parent(self, kit: Kit) -> None:
        old, first = await kit.started("t1", "holder-a")
        await kit.advance(31)
        new = await kit.store.claim("t1", "holder-b", 30)
        moved = kit.checkpoint(first.checkpoint_id)
        await kit.store.commit("t1", Commit(token=new.token, checkpoint=moved))
        for bad_parent in (first.checkpoint_id, "unknown", None):
            with pytest.raises(StaleClaim):
                await kit.store.commit(
                    "t1", Commit(token=old.token, checkpoint=kit.checkpoint(bad_parent))
                )
        with pytest.raises(StaleClaim):
            await kit.store.commit("t1", Commit(token=old.token, expected_version=0))
        with pytest.raises(VersionConflict):
            await kit.store.commit(
                "t1", Commit(token=new.token, checkpoint=kit.checkpoint(first.checkpoint_id))
            )

    @case
    async def test_commit_without_a_claim_or_with_an_unissued_token_is_stale(
        self, kit: Kit
    ) -> None:
        with pytest.raises(StaleClaim):
            await kit.store.commit("t1", Commit(token=1, events=(EventDraft(type="e"),)))
        claim = await kit.claimed("t1")
        for token in (claim.token + 1, claim.token + 1000, 0):
            with pytest.raises(StaleClaim):
                await kit.store.commit("t1", Commit(token=token, checkpoint=kit.checkpoint(None)))
        await kit.store.release("t1", claim.token)
        with pytest.raises(StaleClaim):
            await kit.store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="e"),)))
        assert await kit.store.events_after("t1") == []

    @case
    async def test_holder_commits_and_renews_after_expiry_while_nobody_took_over(
        self, kit: Kit
    ) -> None:
        claim, first = await kit.started("t1", "holder-a")
        await kit.advance(45)
        receipt = await kit.store.commit(
            "t1", Commit(token=claim.token, checkpoint=kit.checkpoint(first.checkpoint_id))
        )
        assert receipt.version == 2
        renewed = await kit.store.renew("t1", claim.token, 30)
        assert renewed.token == claim.token and renewed.holder == "holder-a"
        with pytest.raises(ThreadBusy):
            await kit.store.claim("t1", "holder-b", 30)

    @case
    async def test_renewal_extends_by_the_store_clock(self, kit: Kit) -> None:
        claim = await kit.store.claim("t1", "holder-a", 10)
        await kit.advance(8)
        at = await kit.now()
        renewed = await kit.store.renew("t1", claim.token, 10)
        if kit.exact_expiry:
            assert renewed.expires_at == at + timedelta(seconds=10)
        assert renewed.token == claim.token
        await kit.advance(9)
        with pytest.raises(ThreadBusy):
            await kit.store.claim("t1", "holder-b", 10)
        await kit.advance(1.5)
        assert (await kit.store.claim("t1", "holder-b", 10)).holder == "holder-b"

    @case
    async def test_release_frees_at_once_and_cannot_free_a_successor(self, kit: Kit) -> None:
        first = await kit.claimed("t1", "holder-a")
        await kit.store.release("t1", first.token)
        second = await kit.store.claim("t1", "holder-b", 30)
        await kit.store.release("t1", first.token)
        with pytest.raises(ThreadBusy) as busy:
            await kit.store.claim("t1", "holder-c", 30)
        assert busy.value.holder == "holder-b"
        snap = await kit.store.read("t1")
        assert snap is not None and snap.claim == second

    @case
    async def test_tokens_strictly_increase_across_release_takeover_and_delete(
        self, kit: Kit
    ) -> None:
        tokens = [(await kit.claimed("t1")).token]
        await kit.store.release("t1", tokens[-1])
        tokens.append((await kit.claimed("t1")).token)
        await kit.advance(31)
        tokens.append((await kit.store.claim("t1", "holder-b", 30)).token)
        await kit.store.delete_thread("t1")
        tokens.append((await kit.claimed("t1")).token)
        await kit.store.release("t1", tokens[-1])
        await kit.store.delete_thread("t1")
        tokens.append((await (await kit.reopen()).claim("t1", "holder-c", 30)).token)
        assert all(a < b for a, b in itertools.pairwise(tokens)), tokens

    @case
    async def test_concurrent_claimers_exactly_one_wins(self, kit: Kit) -> None:
        stores = [kit.store, *[await kit.sibling() for _ in range(3)]]

        async def attempt(i: int) -> Claim | ThreadBusy:
            try:
                return await stores[i % len(stores)].claim("t1", f"holder-{i}", 30)
            except ThreadBusy as busy:
                return busy

        results = await asyncio.gather(*(attempt(i) for i in range(16)))
        winners = [r for r in results if isinstance(r, Claim)]
        assert len(winners) == 1
        assert all(r.holder == winners[0].holder for r in results if isinstance(r, ThreadBusy))

    @case
    async def test_concurrent_takeovers_of_an_expired_claim_exactly_one_wins(
        self, kit: Kit
    ) -> None:
        old = await kit.claimed("t1", "holder-old")
        await kit.advance(31)
        stores = [kit.store, *[await kit.sibling() for _ in range(3)]]

        async def attempt(i: int) -> Claim | ThreadBusy:
            try:
                return await stores[i % len(stores)].claim("t1", f"holder-{i}", 30)
            except ThreadBusy as busy:
                return busy

        results = await asyncio.gather(*(attempt(i) for i in range(16)))
        winners = [r for r in results if isinstance(r, Claim)]
        assert len(winners) == 1 and winners[0].token > old.token
        assert all(r.holder == winners[0].holder for r in results if isinstance(r, ThreadBusy))

    @case
    async def test_reopen_keeps_a_live_claim_its_holder_and_token(self, kit: Kit) -> None:
        claim, _ = await kit.started("t1", "holder-a")
        store = await kit.reopen()
        snap = await store.read("t1")
        assert snap is not None and snap.claim == claim
        with pytest.raises(ThreadBusy) as busy:
            await store.claim("t1", "holder-b", 30)
        assert busy.value.holder == "holder-a"
        receipt = await store.commit(
            "t1", Commit(token=claim.token, events=(EventDraft(type="e"),))
        )
        assert receipt.events == (2,)

    @case
    async def test_reopen_keeps_fencing_and_token_monotonicity(self, kit: Kit) -> None:
        old, _ = await kit.started("t1", "holder-a")
        await kit.advance(31)
        new = await kit.store.claim("t1", "holder-b", 30)
        store = await kit.reopen()
        with pytest.raises(StaleClaim):
            await store.commit("t1", Commit(token=old.token, events=(EventDraft(type="e"),)))
        with pytest.raises(StaleClaim):
            await store.renew("t1", old.token, 30)
        await store.release("t1", new.token)
        assert (await store.claim("t1", "holder-c", 30)).token > new.token

    @case
    async def test_wait_events_returns_at_once_when_events_exist(self, kit: Kit) -> None:
        await kit.started("t1")
        events = await asyncio.wait_for(kit.store.wait_events("t1", 0, timeout=60), 10)
        assert [e.seq for e in events] == [1]

    @case
    async def test_wait_events_returns_empty_after_its_timeout(self, kit: Kit) -> None:
        await kit.started("t1")
        assert await kit.store.wait_events("t1", 1, timeout=0.05) == []
        assert await kit.store.wait_events("t-idle", 0, timeout=0.05) == []

    @case
    async def test_wait_events_wakes_for_a_commit_through_this_store(self, kit: Kit) -> None:
        claim, _ = await kit.started("t1")
        waiter = asyncio.create_task(kit.store.wait_events("t1", 1, timeout=60))
        await asyncio.sleep(0)
        assert not waiter.done()
        await kit.store.commit("t1", Commit(token=claim.token, events=(EventDraft(type="b"),)))
        events = await asyncio.wait_for(waiter, 10)
        assert [e.type for e in events] == ["b"]

    @case
    async def test_wait_events_wakes_for_a_commit_through_a_sibling(self, kit: Kit) -> None:
        claim, _ = await kit.started("t1")
        other = await kit.sibling()
        waiter = asyncio.create_task(kit.store.wait_events("t1", 1, timeout=60))
        await asyncio.sleep(0)
        assert not waiter.done()
        await other.commit("t1", Commit(token=claim.token, events=(EventDraft(type="b"),)))
        events = await asyncio.wait_for(waiter, 10)
        assert [e.type for e in events] == ["b"]
