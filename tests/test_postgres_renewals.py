"""PostgreSQL grouped claim renewals (issue 24, part 2): concurrent renewals go out as one
statement, each fenced and answered on its own, and the lease follows its claim."""

from __future__ import annotations

import asyncio

import pytest

from tests.postgres_support import Databases, open_test_store
from wakeful.errors import StaleClaim
from wakeful.records import Claim, Dispatch

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def test_concurrent_renewals_are_grouped_and_each_is_fenced_on_its_own(
    pg_databases: Databases,
) -> None:
    store = await open_test_store(await pg_databases.clone(), pool_size=4)
    try:
        for i in range(3):
            await store.enqueue(Dispatch(dispatch_id=f"d{i}", thread_id=f"q{i}", kind="start"))
        leases = await store.claim_next("w", 5, 3)
        claims = [await store.claim(f"t{i}", "w", 5) for i in range(20)]
        taken = await store.claim("t-other", "w", 5)
        await store.release("t-other", taken.token)  # its token is stale from now on
        requests: list[tuple[str, int]] = [(c.thread_id, c.token) for c in claims]
        requests += [(lease.claim.thread_id, lease.claim.token) for lease in leases]
        requests += [("t-other", taken.token), ("t3", claims[3].token + 1)]
        requests.append(requests[1])  # the same renewal twice in one batch: sent once

        before = store._renewals.batches
        outcomes = await asyncio.gather(
            *(store.renew(thread, token, 120) for thread, token in requests),
            return_exceptions=True,
        )
        assert store._renewals.batches == before + 1, "renewals queued behind one are grouped"
        assert store._renewals.grouped == len(set(requests)) - 1  # all but the first, once
        assert outcomes[-1] == outcomes[1]
        for (thread, token), outcome in zip(requests, outcomes, strict=True):
            if (thread, token) in (("t-other", taken.token), ("t3", claims[3].token + 1)):
                assert isinstance(outcome, StaleClaim), (thread, outcome)
                assert outcome.current == (None if thread == "t-other" else claims[3].token)
                continue
            assert isinstance(outcome, Claim), (thread, outcome)
            assert outcome.thread_id == thread and outcome.token == token
            assert outcome.holder == "w"
            snap = await store.read(thread)
            assert snap is not None and snap.claim is not None
            assert snap.claim.expires_at == outcome.expires_at
            assert (outcome.expires_at - claims[0].expires_at).total_seconds() > 100
        for lease in leases:  # the lease granted with a claim follows the claim
            d = await store.get_dispatch(lease.dispatch.dispatch_id)
            renewed = outcomes[requests.index((lease.claim.thread_id, lease.claim.token))]
            assert d is not None and isinstance(renewed, Claim)
            assert d.lease_until == renewed.expires_at
    finally:
        await store.close()


async def test_a_renewal_alone_is_the_single_call(pg_databases: Databases) -> None:
    store = await open_test_store(await pg_databases.clone(), pool_size=2)
    try:
        claim = await store.claim("t", "w", 5)
        renewed = await store.renew("t", claim.token, 60)
        assert renewed.token == claim.token and renewed.expires_at > claim.expires_at
        with pytest.raises(StaleClaim):
            await store.renew("t", claim.token + 1, 60)
        assert store._renewals.batches == 0
    finally:
        await store.close()
