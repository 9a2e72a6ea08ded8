"""Rate limits on model calls (issue 39): the calls of agents on several store handles (as
several workers) take from one bucket in the store, and a provider's 429 holds them all
back, against a real loopback OpenAI-compatible server. The bucket arithmetic itself is
in the conformance suite (``wakeful.testkit.limit_cases``)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.chat_server import ChatServer
from tests.postgres_support import Databases, open_test_store
from tests.provider_server import Reply, openai_text
from wakeful import ManualClock, open_store
from wakeful.agent import Agent
from wakeful.agent.limiting import CLAIM_CHECK_EVERY, CallLimits, estimate_tokens, limits_of
from wakeful.errors import CheckpointWriteFailed, InvalidInput, StaleClaim, UnsupportedStore
from wakeful.limits import MAX_LIMIT_WAIT, LimitWaiter, RateLimit
from wakeful.providers import AnthropicMessages, ModelRequest, OpenAIChat, Scripted
from wakeful.providers.http import error_from_response, reset_from_headers
from wakeful.records import Message
from wakeful.runtime import ClaimPolicy, Runtime
from wakeful.runtime.events import LiveEvent
from wakeful.store.contract import RateLimitStore, Store
from wakeful.store.memory import MemoryStore

pytest_plugins = ["tests.postgres_fixtures"]
KEY = "local:chat"


class RefusingServer(ChatServer):
    """Answers 429 with ``Retry-After: 2`` to every request in the 2 s after the first one,
    and records when each request arrived (``time.monotonic``)."""

    def __init__(self) -> None:
        super().__init__(answer="ok")
        self.arrivals: list[float] = []
        self.refused_until: float | None = None

    def _record(self, path: str, headers: dict[str, str], raw: bytes) -> None:
        with self._lock:
            self.arrivals.append(time.monotonic())
        super()._record(path, headers, raw)

    def _next(self) -> Reply:
        with self._lock:
            now = self.arrivals[-1]
            if self.refused_until is None:
                self.refused_until = now + 2.0
            if now < self.refused_until:
                return Reply(
                    status=429,
                    headers=[("Retry-After", "2")],
                    body=b'{"error": {"type": "rate_limit_error", "message": "slow down"}}',
                )
        return super()._next()


async def _until_blocked(store: Store, seconds: float) -> None:
    """Poll until ``KEY`` reads blocked, for at most ``seconds``."""
    assert isinstance(store, RateLimitStore)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(b.key == KEY and b.blocked_until for b in await store.limit_buckets()):
            return
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_after_a_429_no_worker_on_sqlite_sends_a_request_until_retry_after_passed(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    await _fleet_backs_off_together(await open_store(url), await open_store(url))


@pytest.mark.asyncio
@pytest.mark.postgres
async def test_after_a_429_no_worker_on_postgres_sends_a_request_until_retry_after_passed(
    pg_databases: Databases,
) -> None:
    dsn = await pg_databases.clone()
    await _fleet_backs_off_together(await open_test_store(dsn), await open_test_store(dsn))


async def _fleet_backs_off_together(first: Store, second: Store) -> None:
    """Two store handles on one storage, as two workers, each with its own provider."""
    limit = RateLimit(key=KEY, requests_per_minute=600)
    with RefusingServer() as server:
        providers = [OpenAIChat("m", base_url=server.base_url, limits=[limit]) for _ in range(2)]
        try:
            runtimes = [
                Runtime(store, holder=f"worker-{i}") for i, store in enumerate((first, second))
            ]
            agents = [Agent("a", provider) for provider in providers]
            one = asyncio.create_task(agents[0].run(runtimes[0], "t-0", "hi"))
            # the second worker starts once the first one's 429 is recorded in the store (or
            # after a second without it: then its requests show that nothing held it back)
            await _until_blocked(second, 1.0)
            others = [
                asyncio.create_task(agents[1].run(runtimes[1], f"t-{i}", "hi")) for i in (1, 2)
            ]
            replies = await asyncio.wait_for(asyncio.gather(one, *others), 15)
        finally:
            for provider in providers:
                await provider.aclose()
            await first.close()
            await second.close()
    assert [r.text for r in replies] == ["ok"] * 3
    refused_at, *later = server.arrivals
    assert len(later) == 3, server.arrivals  # each run's call once, none refused again
    assert min(later) - refused_at >= 1.95, [t - refused_at for t in later]


class CountingStore(MemoryStore):
    """Counts the rate-limit calls that reach the store."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.calls: list[str] = []

    async def take_limit(
        self,
        limit: RateLimit,
        requests: int,
        tokens: int,
        settle: int = 0,
        waiter: LimitWaiter | None = None,
    ) -> float:
        self.calls.append(f"take settle={settle}")
        return await super().take_limit(limit, requests, tokens, settle, waiter)

    async def reconcile_limit(self, key: str, tokens: int) -> None:
        self.calls.append(f"reconcile {tokens}")
        await super().reconcile_limit(key, tokens)


@pytest.mark.asyncio
async def test_a_run_reconciles_its_token_estimate_with_the_reported_usage_at_its_next_take() -> (
    None
):
    clock = ManualClock()
    store = CountingStore(clock)
    limit = RateLimit(key=KEY, tokens_per_minute=600_000)  # 10,000 tokens in the bucket
    available: list[float] = []
    with ChatServer() as server:
        server.push(*(Reply(events=openai_text("Hello.", usage=(19, 10))) for _ in range(2)))
        provider = OpenAIChat("m", base_url=server.base_url, limits=limit)
        runtime = Runtime(store, clock=clock)
        try:
            for thread in ("t-1", "t-2"):
                reply = await Agent("a", provider).run(runtime, thread, "hi")
                assert reply.text == "Hello."
                (bucket,) = await store.limit_buckets()
                assert bucket.tokens_available is not None
                available.append(bucket.tokens_available)
        finally:
            await provider.aclose()
    # the frozen clock refills nothing. After the first call its estimate is missing (its
    # usage is pending in the process); the second call's take paid the first call's usage
    # minus its estimate first, so between the two exactly the first call's 19 + 10 went
    estimate = round(10_000 - available[0])
    assert estimate > 29
    assert available[1] == pytest.approx(available[0] - 29)
    # one store call per model call: no reconcile statement of its own
    assert store.calls == ["take settle=0", f"take settle={29 - estimate}"]


@pytest.mark.asyncio
async def test_a_run_waiting_for_its_limit_keeps_its_claim_and_says_what_it_waits_for(
    tmp_path: Path,
) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'w.db'}")
    assert isinstance(store, RateLimitStore)
    await store.block_limit(KEY, 1.2)
    model = Scripted.replies("done")
    agent = Agent("a", model, limits=RateLimit(key=KEY, requests_per_minute=600))
    runtime = Runtime(store, ClaimPolicy(ttl=0.6, renew_every=0.2, stall_after=0.2))
    live = runtime.live.attach("t")
    try:
        task = asyncio.create_task(agent.run(runtime, "t", "hi"))
        await asyncio.sleep(0.9)  # longer than the claim's ttl and stall_after
        snap = await store.read("t")
        assert snap is not None and snap.claim is not None, "the waiting run holds its claim"
        assert snap.claim.expires_at > datetime.now(UTC)
        assert not task.done() and model.requests == [], "nothing was sent while blocked"
        reply = await asyncio.wait_for(task, 5)
    finally:
        await store.close()
    assert reply.text == "done"
    seen = [live.get_nowait() for _ in range(live.qsize())]
    waits = [e.data for e in seen if isinstance(e, LiveEvent) and e.type == "waiting_for_limit"]
    assert waits and waits[0]["key"] == KEY and 0 < waits[0]["seconds"] <= 1.2


@pytest.mark.asyncio
async def test_limits_on_a_store_without_buckets_are_refused_with_what_to_do() -> None:
    class NoBuckets:
        pass

    with pytest.raises(UnsupportedStore, match="rate-limit buckets"):
        CallLimits.for_store([RateLimit(key=KEY)], NoBuckets(), asyncio.sleep)
    assert CallLimits.for_store([], NoBuckets(), asyncio.sleep) is None


def test_the_estimate_counts_the_text_and_the_reserved_output() -> None:
    request = ModelRequest(
        model="m", messages=(Message(id="u", role="user", content="x" * 400),), max_tokens=50
    )
    assert estimate_tokens(request) == 400 // 4 + 1 + 50


def test_the_rate_limit_headers_of_openai_and_anthropic_give_the_reset() -> None:
    openai = {
        "x-ratelimit-reset-requests": "6m0s",
        "x-ratelimit-reset-tokens": "20ms",
        "x-ratelimit-remaining-tokens": "0",
    }
    assert reset_from_headers(openai) == pytest.approx(0.02)  # the exhausted one
    assert reset_from_headers({"x-ratelimit-reset-requests": "1m2.5s"}) == 62.5
    anthropic = {
        "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:07Z",
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:03Z",
    }
    now = 1767225600.0  # 2026-01-01T00:00:00Z
    assert reset_from_headers(anthropic, now=now) == 7.0
    assert reset_from_headers({"x-ratelimit-reset-requests": "soon"}) is None
    # a 429 without Retry-After takes its hint from them; other statuses do not
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    refused = httpx.Response(429, headers={"x-ratelimit-reset-requests": "3s"}, request=request)
    assert error_from_response(refused).retry_after == 3.0
    failed = httpx.Response(503, headers={"x-ratelimit-reset-requests": "3s"}, request=request)
    assert error_from_response(failed).retry_after is None


def test_limits_are_validated_where_they_are_configured() -> None:
    with pytest.raises(InvalidInput, match="requests_per_minute"):
        RateLimit(key=KEY, requests_per_minute=0)
    with pytest.raises(InvalidInput, match="limit key"):
        RateLimit(key="no spaces")
    with pytest.raises(InvalidInput, match="burst_seconds"):
        RateLimit(key=KEY, burst_seconds=float("nan"))
    limit = RateLimit(key=KEY, tokens_per_minute=600)
    assert AnthropicMessages("m", limits=limit).limits == (limit,)
    assert OpenAIChat("m").limits == ()
    with pytest.raises(InvalidInput, match="names a key twice"):
        OpenAIChat("m", limits=[limit, limit])
    with pytest.raises(InvalidInput, match="RateLimit"):
        Agent("a", Scripted.replies("x"), limits=["openai"])  # type: ignore[list-item]
    # a key on both the agent and its provider is taken once, with the provider's rates
    other = RateLimit(key=KEY, requests_per_minute=1)
    assert limits_of(OpenAIChat("m", limits=limit), Agent("a", Scripted([]), limits=other)) == (
        limit,
    )


@pytest.mark.asyncio
async def test_a_run_that_loses_its_claim_while_it_waits_for_its_limit_stops_waiting() -> None:
    """A cancel or a takeover takes the claim of a run waiting out a long block: the run
    notices within ``CLAIM_CHECK_EVERY`` of waiting, sends nothing and records nothing."""
    clock = ManualClock()
    store = MemoryStore(clock)
    await store.block_limit(KEY, 600)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)
        if len(slept) == 1:  # the thread's claim is taken while the run waits
            snap = await store.read("t")
            assert snap is not None and snap.claim is not None
            await store.release("t", snap.claim.token)

    model = Scripted.replies("never sent")
    agent = Agent("a", model, limits=RateLimit(key=KEY, requests_per_minute=60), sleep=sleep)
    with pytest.raises(CheckpointWriteFailed, match="StaleClaim") as stopped:
        await asyncio.wait_for(agent.run(Runtime(store, clock=clock), "t", "hi"), 10)
    assert model.requests == []
    assert sum(slept) <= CLAIM_CHECK_EVERY + MAX_LIMIT_WAIT, slept
    assert isinstance(stopped.value.cause, StaleClaim)
