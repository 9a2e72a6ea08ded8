"""The rate-limit headers of OpenAI and Anthropic block the bucket for the fleet (issue 39):
a 429's ``Retry-After`` or, without it, the provider's reset headers; and a successful
answer whose headers say a limit is used up (``remaining: 0``), so that the next call waits
for the reset instead of earning a 429. Both adapters, against a loopback server; the store's
clock is manual and the agent's sleeps advance it, so every wait is exact."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.provider_server import (
    ProviderServer,
    Reply,
    anthropic_error,
    anthropic_text,
    openai_error,
    openai_text,
)
from wakeful import ManualClock
from wakeful.agent import Agent
from wakeful.agent.recovery import StreamPolicy
from wakeful.limits import RateLimit
from wakeful.providers import AnthropicMessages, OpenAIChat
from wakeful.providers.http import exhausted_from_headers
from wakeful.runtime import Runtime
from wakeful.store.memory import MemoryStore

KEY = "provider:model"
LIMIT = RateLimit(key=KEY, requests_per_minute=6000)


class BlockLog(MemoryStore):
    """Records each block a call sets."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.blocks: list[tuple[str, float]] = []

    async def block_limit(self, key: str, seconds: float) -> None:
        self.blocks.append((key, seconds))
        await super().block_limit(key, seconds)


class Timed(ProviderServer):
    """Records the store's clock at each request's arrival."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.at: list[datetime] = []

    def _record(self, path: str, headers: dict[str, str], raw: bytes) -> None:
        self.at.append(self.clock.now())
        super()._record(path, headers, raw)


def _instant(seconds: float) -> str:
    """An Anthropic reset time ``seconds`` from now (wall clock, as the adapter reads it)."""
    at = datetime.now(UTC) + timedelta(seconds=seconds)
    return at.isoformat().replace("+00:00", "Z")


def _model(kind: str, server: ProviderServer) -> Any:
    if kind == "openai":
        return OpenAIChat("m", base_url=f"{server.url}/v1", limits=LIMIT)
    return AnthropicMessages("m", base_url=server.url, api_key="k", limits=LIMIT)


def _ok(kind: str, headers: list[tuple[str, str]] | None = None) -> Reply:
    events = openai_text("ok") if kind == "openai" else anthropic_text("ok")
    return Reply(events=events, headers=headers or [])


def _refused(kind: str, headers: list[tuple[str, str]]) -> Reply:
    body = (
        openai_error("rate_limit_exceeded", "rate_limit_exceeded", "slow down")
        if kind == "openai"
        else anthropic_error("rate_limit_error", "slow down")
    )
    return Reply(status=429, headers=headers, body=body)


async def _runs(kind: str, replies: list[Reply], threads: int) -> tuple[BlockLog, list[float]]:
    """Run ``threads`` agent runs one after the other; the blocks set and the seconds of the
    store's clock between the first request and each later one."""
    clock = ManualClock()

    async def sleep(seconds: float) -> None:
        clock.advance(max(seconds, 1e-6))  # a real sleep lasts at least the clock's tick

    store = BlockLog(clock)
    with Timed(clock) as server:
        server.push(*replies)
        model = _model(kind, server)
        policy = StreamPolicy(max_retries=2, initial_backoff=0.01, max_backoff=0.01, jitter=0.0)
        agent = Agent("a", model, sleep=sleep, stream_policy=policy)
        try:
            for i in range(threads):
                reply = await agent.run(Runtime(store, clock=clock), f"t-{i}", "hi")
                assert reply.text == "ok"
        finally:
            await model.aclose()
    first, *later = server.at
    return store, [(t - first).total_seconds() for t in later]


OPENAI_429 = [
    ("x-ratelimit-limit-requests", "60"),
    ("x-ratelimit-remaining-requests", "0"),
    ("x-ratelimit-reset-requests", "7s"),
    ("x-ratelimit-remaining-tokens", "149000"),
    ("x-ratelimit-reset-tokens", "400ms"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_429_without_retry_after_blocks_until_the_exhausted_limits_reset(
    kind: str,
) -> None:
    headers = (
        OPENAI_429
        if kind == "openai"
        else [
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", _instant(7)),
            ("anthropic-ratelimit-tokens-remaining", "20000"),
            ("anthropic-ratelimit-tokens-reset", _instant(1)),
        ]
    )
    store, later = await _runs(kind, [_refused(kind, headers), _ok(kind)], 1)
    [(key, seconds)] = store.blocks
    assert key == KEY and seconds == pytest.approx(7, abs=0.5)  # the exhausted one's reset
    assert later[0] == pytest.approx(seconds, abs=0.02), "the retry waited for the reset"


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_429s_retry_after_wins_over_the_reset_headers(kind: str) -> None:
    reset = ("x-ratelimit-reset-requests", "30s") if kind == "openai" else (
        "anthropic-ratelimit-requests-reset", _instant(30)
    )  # fmt: skip
    headers = [("retry-after", "3"), reset]
    store, later = await _runs(kind, [_refused(kind, headers), _ok(kind)], 1)
    assert store.blocks == [(KEY, 3.0)]
    assert later[0] == pytest.approx(3.0, abs=0.02)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_an_answer_that_used_a_limit_up_blocks_the_next_call_until_its_reset(
    kind: str,
) -> None:
    used_up = (
        [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "4s"),
         ("x-ratelimit-remaining-tokens", "900"), ("x-ratelimit-reset-tokens", "20s")]
        if kind == "openai"
        else [("anthropic-ratelimit-requests-remaining", "0"),
              ("anthropic-ratelimit-requests-reset", _instant(4)),
              ("anthropic-ratelimit-tokens-remaining", "900"),
              ("anthropic-ratelimit-tokens-reset", _instant(20))]
    )  # fmt: skip
    room = (
        [("x-ratelimit-remaining-requests", "59"), ("x-ratelimit-reset-requests", "1s")]
        if kind == "openai"
        else [("anthropic-ratelimit-requests-remaining", "49"),
              ("anthropic-ratelimit-requests-reset", _instant(1))]
    )  # fmt: skip
    store, later = await _runs(kind, [_ok(kind, room), _ok(kind, used_up), _ok(kind)], 3)
    # the first answer left room: nothing blocked; the second used the requests up: the
    # third call waited for their reset (not for the tokens', which were not used up)
    [(key, seconds)] = store.blocks
    assert key == KEY and seconds == pytest.approx(4, abs=0.5)
    assert later[0] == pytest.approx(0.0, abs=0.02)
    assert later[1] - later[0] == pytest.approx(seconds, abs=0.02)


def test_only_a_used_up_limit_with_a_reset_ahead_counts_as_exhausted() -> None:
    now = 1767225600.0  # 2026-01-01T00:00:00Z
    assert exhausted_from_headers({"x-ratelimit-reset-requests": "3s"}, now=now) is None
    assert exhausted_from_headers(
        {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1m30s"}, now=now
    ) == 90.0  # fmt: skip
    past = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2025-12-31T23:59:59Z",
    }
    assert exhausted_from_headers(past, now=now) is None
    both = {
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": "2026-01-01T00:00:05Z",
        "anthropic-ratelimit-output-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:02Z",
    }
    assert exhausted_from_headers(both, now=now) == 5.0
