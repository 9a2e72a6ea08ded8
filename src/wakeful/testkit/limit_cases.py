"""Conformance cases: rate-limit buckets shared through the store (issue 39,
``RateLimitStore``). Times are exact on the store's clock (the manual clock, or a frozen
server clock), so waits are checked to the millisecond."""

from __future__ import annotations

import pytest

from wakeful.errors import InvalidInput
from wakeful.limits import LimitWaiter, RateLimit
from wakeful.store.contract import RateLimitStore
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio
RPM_120 = RateLimit(key="openai:gpt-4o", requests_per_minute=120)
"""Two requests a second; the bucket holds one second's worth: two requests."""
TPM_600 = RateLimit(key="anthropic:claude", tokens_per_minute=600)
"""Ten tokens a second; the bucket holds ten."""


def _buckets(kit: Kit) -> RateLimitStore:
    store = kit.store
    if not isinstance(store, RateLimitStore):
        pytest.skip(f"{type(store).__name__} keeps no rate-limit buckets")
    return store


def _near(value: float) -> object:
    return pytest.approx(value, abs=1e-3)


class LimitCases(Harness):
    @case
    async def test_a_bucket_grants_its_burst_then_names_the_wait_for_the_next_request(
        self, kit: Kit
    ) -> None:
        store = _buckets(kit)
        assert [await store.take_limit(RPM_120, 1, 0) for _ in range(2)] == [0.0, 0.0]
        assert await store.take_limit(RPM_120, 1, 0) == _near(0.5)
        assert await store.take_limit(RPM_120, 1, 0) == _near(0.5)  # a refusal takes nothing
        await kit.advance(0.5)
        assert await store.take_limit(RPM_120, 1, 0) == 0.0
        assert await store.take_limit(RPM_120, 1, 0) == _near(0.5)

    @case
    async def test_a_call_larger_than_the_bucket_leaves_a_debt_later_calls_wait_for(
        self, kit: Kit
    ) -> None:
        store = _buckets(kit)
        assert await store.take_limit(TPM_600, 1, 30) == 0.0  # a full bucket grants it
        # 10 - 30 = -20 tokens: one more token is 21 tokens of refill away, at 10 a second
        assert await store.take_limit(TPM_600, 1, 1) == _near(2.1)
        await kit.advance(2.1)
        assert await store.take_limit(TPM_600, 1, 1) == 0.0

    @case
    async def test_reconcile_gives_back_an_overestimate_and_pays_an_underestimate(
        self, kit: Kit
    ) -> None:
        store = _buckets(kit)
        assert await store.take_limit(TPM_600, 1, 10) == 0.0
        assert await store.take_limit(TPM_600, 1, 10) == _near(1.0)
        await store.reconcile_limit(TPM_600.key, -8)  # the call used 2 of the 10 estimated
        assert await store.take_limit(TPM_600, 1, 8) == 0.0
        await store.reconcile_limit(TPM_600.key, 5)  # a call used 5 more than it took
        assert await store.take_limit(TPM_600, 1, 1) == _near(0.6)
        await store.reconcile_limit(TPM_600.key, -1000)  # never above a full bucket
        assert await store.take_limit(TPM_600, 1, 10) == 0.0
        assert await store.take_limit(TPM_600, 1, 1) == _near(0.1)
        await store.reconcile_limit("never-used", 5)  # an unknown key: nothing to pay

    @case
    async def test_a_take_pays_its_settle_first_granted_or_not(self, kit: Kit) -> None:
        store = _buckets(kit)
        assert await store.take_limit(TPM_600, 1, 10) == 0.0
        # an earlier call used 8 fewer than it took: given back before this take
        assert await store.take_limit(TPM_600, 1, 8, settle=-8) == 0.0
        assert await store.take_limit(TPM_600, 1, 1) == _near(0.1)
        # a debt of 5 is paid even by a refused take: the next take waits for it too
        assert await store.take_limit(TPM_600, 1, 1, settle=5) == _near(0.6)
        assert await store.take_limit(TPM_600, 1, 1) == _near(0.6)
        # a settle never fills the bucket above full, and a key without a token rate
        # ignores it
        assert await store.take_limit(TPM_600, 1, 10, settle=-1000) == 0.0
        assert await store.take_limit(TPM_600, 1, 1) == _near(0.1)
        assert await store.take_limit(RPM_120, 1, 0, settle=50) == 0.0
        assert await store.take_limit(RPM_120, 1, 0, settle=-50) == 0.0
        assert await store.take_limit(RPM_120, 1, 0) == _near(0.5)

    @case
    async def test_a_refused_take_lists_its_run_as_waiting_until_a_take_is_granted(
        self, kit: Kit
    ) -> None:
        store = _buckets(kit)
        first = LimitWaiter(run_id="run-1", thread_id="t-1")
        second = LimitWaiter(run_id="run-2", thread_id="t-2")
        assert await store.take_limit(RPM_120, 2, 0, waiter=first) == 0.0
        (bucket,) = await store.limit_buckets()
        assert bucket.waiting == (), "a granted take records nothing"
        assert await store.take_limit(RPM_120, 1, 0, waiter=first) == _near(0.5)
        await kit.advance(0.1)
        assert await store.take_limit(RPM_120, 1, 0, waiter=second) == _near(0.4)
        assert await store.take_limit(RPM_120, 1, 0, waiter=first) == _near(0.4)
        (bucket,) = await store.limit_buckets()
        assert [(w.run_id, w.thread_id) for w in bucket.waiting] == [
            ("run-1", "t-1"),
            ("run-2", "t-2"),
        ]
        one, two = bucket.waiting
        assert (bucket.at - one.since).total_seconds() == _near(0.1), "since its first refusal"
        assert (one.until - bucket.at).total_seconds() == _near(0.4), "when it asks again"
        assert (two.until - two.since).total_seconds() == _near(0.4)
        await kit.advance(0.4)
        assert await store.take_limit(RPM_120, 1, 0, waiter=first) == 0.0
        (bucket,) = await store.limit_buckets()
        assert [w.run_id for w in bucket.waiting] == ["run-2"]
        # a waiter that never asks again (its worker died) is listed no longer than
        # WAITER_GRACE past the check it announced
        await kit.advance(3.0)
        (bucket,) = await store.limit_buckets()
        assert bucket.waiting == ()

    @case
    async def test_a_block_holds_every_take_until_its_end_and_the_bucket_refills_from_empty(
        self, kit: Kit
    ) -> None:
        store = _buckets(kit)
        assert await store.take_limit(RPM_120, 1, 0) == 0.0
        await store.block_limit(RPM_120.key, 2.0)
        await store.block_limit(RPM_120.key, 1.0)  # an earlier end does not shorten it
        other = await kit.sibling()
        assert isinstance(other, RateLimitStore)
        assert await other.take_limit(RPM_120, 1, 0) == _near(2.0)
        await kit.advance(1.5)
        assert await store.take_limit(RPM_120, 1, 0) == _near(0.5)
        await kit.advance(0.5)
        # drained: the first request after the block is half a second of refill away
        assert await other.take_limit(RPM_120, 1, 0) == _near(0.5)
        await kit.advance(0.5)
        assert await store.take_limit(RPM_120, 1, 0) == 0.0

    @case
    async def test_a_block_of_a_key_never_taken_drains_it_for_its_first_take(
        self, kit: Kit
    ) -> None:
        store = _buckets(kit)
        await store.block_limit(TPM_600.key, 1.0)
        assert await store.take_limit(TPM_600, 1, 5) == _near(1.0)
        await kit.advance(1.0)
        assert await store.take_limit(TPM_600, 1, 5) == _near(0.5)

    @case
    async def test_buckets_list_rates_availability_and_blocks_by_key(self, kit: Kit) -> None:
        store = _buckets(kit)
        assert await store.limit_buckets() == []
        await store.take_limit(RPM_120, 1, 0)
        await store.take_limit(TPM_600, 1, 4)
        await store.block_limit("zz-blocked", 3.0)
        now = await kit.now()
        listed = await store.limit_buckets()
        assert [b.key for b in listed] == ["anthropic:claude", "openai:gpt-4o", "zz-blocked"]
        tokens, requests, blocked = listed
        assert (tokens.tokens_per_minute, tokens.requests_per_minute) == (600, None)
        assert tokens.tokens_available == _near(6.0)
        assert tokens.requests_available is None and tokens.blocked_until is None
        assert requests.requests_available == _near(1.0)
        assert blocked.blocked_until is not None
        assert (blocked.blocked_until - now).total_seconds() == _near(3.0)

    @case
    async def test_malformed_limit_calls_are_refused_and_change_nothing(self, kit: Kit) -> None:
        store = _buckets(kit)
        with pytest.raises(InvalidInput):
            await store.take_limit(RPM_120, -1, 0)
        with pytest.raises(InvalidInput):
            await store.take_limit("openai", 1, 0)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            await store.block_limit(RPM_120.key, -1.0)
        with pytest.raises(InvalidInput):
            await store.block_limit("bad key", 1.0)
        with pytest.raises(InvalidInput):
            await store.reconcile_limit(RPM_120.key, 1.5)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            await store.take_limit(RPM_120, 1, 0, settle=10**10)
        with pytest.raises(InvalidInput):
            await store.take_limit(RPM_120, 1, 0, waiter="run-1")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            LimitWaiter(run_id="no spaces", thread_id="t")
        assert await store.limit_buckets() == []
