"""Operators see the rate limits (issue 39 item 5): per-key gauges on the API's /metrics and
``wakeful limits list`` (table and --json), from the buckets the store holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.cli_support import cli, error_line
from tests.metrics_support import sample
from tests.server_support import ALPHA, BETA, OPERATOR, running_api, seed_thread
from wakeful import ManualClock, open_store
from wakeful.limits import LimitWaiter, RateLimit
from wakeful.records import Dispatch
from wakeful.store.contract import RateLimitStore
from wakeful.store.memory import MemoryStore

GPT = RateLimit(key="openai:gpt-4o", requests_per_minute=120, tokens_per_minute=6000)


@pytest.mark.asyncio
async def test_metrics_show_each_keys_bucket_and_block() -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    store = MemoryStore(clock)
    assert await store.take_limit(GPT, 1, 40) == 0.0
    await store.block_limit("anthropic:claude", 30)
    waiter = LimitWaiter(run_id="run-1", thread_id="t-1")
    assert await store.take_limit(GPT, 1, 100, waiter=waiter) > 0
    async with running_api(store) as api:
        scrape = (await api.client(None).get("/metrics")).text
    gpt, claude = '{key="openai:gpt-4o"}', '{key="anthropic:claude"}'
    assert sample(scrape, f"wakeful_limit_requests_available{gpt}") == 1.0  # 2 - 1
    assert sample(scrape, f"wakeful_limit_tokens_available{gpt}") == 60.0  # 100 - 40
    assert sample(scrape, f"wakeful_limit_requests_per_minute{gpt}") == 120.0
    assert sample(scrape, f"wakeful_limit_tokens_per_minute{gpt}") == 6000.0
    assert sample(scrape, f"wakeful_limit_blocked_until_seconds{gpt}") == 0.0
    assert sample(scrape, f"wakeful_limit_waiting_runs{gpt}") == 1.0
    assert sample(scrape, f"wakeful_limit_waiting_runs{claude}") == 0.0
    blocked = sample(scrape, f"wakeful_limit_blocked_until_seconds{claude}")
    assert blocked == datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC).timestamp()


@pytest.mark.asyncio
async def test_limits_list_shows_the_buckets_as_a_table_and_as_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'limits.db'}"
    async with open_store(url) as store:
        assert isinstance(store, RateLimitStore)
        await store.take_limit(GPT, 1, 40)
        await store.block_limit("anthropic:claude", 600)
        # a run refused by the blocked key asks again in 5 s (MAX_LIMIT_WAIT): listed for 7 s
        waiter = LimitWaiter(run_id="run-waits", thread_id="t-1")
        limit = RateLimit(key="anthropic:claude", tokens_per_minute=6000)
        assert await store.take_limit(limit, 1, 10, waiter=waiter) > 0
    listed = cli("limits", "list", "--json", store=url)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["key"] for r in rows] == ["anthropic:claude", "openai:gpt-4o"]
    claude, gpt = rows
    assert claude["blocked_until"] is not None and gpt["blocked_until"] is None
    assert (gpt["requests_per_minute"], gpt["tokens_per_minute"]) == (120, 6000)
    assert 1.0 <= gpt["requests_available"] <= 2.0 and 60 <= gpt["tokens_available"] <= 100
    assert [w["run_id"] for w in claude["waiting"]] == ["run-waits"] and gpt["waiting"] == []
    shown = cli("limits", "list", store=url)
    assert shown.returncode == 0, shown.stderr
    assert "openai:gpt-4o" in shown.stdout and "of 120/min" in shown.stdout
    assert "run-waits" in shown.stdout
    missing = cli("limits", "list", store=f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 3 and "no store at" in error_line(missing)


@pytest.mark.asyncio
async def test_the_limits_route_shows_buckets_to_all_and_waiting_runs_to_their_tenant() -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    store = MemoryStore(clock)
    await seed_thread(store, "ta", tenant="alpha")
    await seed_thread(store, "tb", tenant="beta")
    assert await store.take_limit(GPT, 2, 100) == 0.0  # empties the bucket
    for run, thread in (("run-a", "ta"), ("run-b", "tb")):
        waiter = LimitWaiter(run_id=run, thread_id=thread)
        assert await store.take_limit(GPT, 1, 10, waiter=waiter) > 0
        clock.advance(0.1)
    await store.block_limit("anthropic:claude", 30)
    async with running_api(store) as api:
        seen = {}
        for name, token in (("alpha", ALPHA), ("beta", BETA), ("operator", OPERATOR)):
            r = await api.client(token).get("/v1/limits")
            assert r.status_code == 200, r.text
            seen[name] = r.json()
        anonymous = await api.client(None).get("/v1/limits")
    assert anonymous.status_code == 401
    body = seen["operator"]
    assert body["concurrency"] == []
    claude, gpt = body["rate_limits"]
    assert claude["key"] == "anthropic:claude"
    assert claude["blocked_until"] == "2026-01-01T00:00:30.200000Z"
    assert gpt["key"] == "openai:gpt-4o"
    assert (gpt["requests_per_minute"], gpt["request_capacity"]) == (120, 2)
    assert (gpt["tokens_per_minute"], gpt["token_capacity"]) == (6000, 100)
    # 0.2 s after the bucket was emptied: 0.4 of a request and 20 tokens have refilled
    assert gpt["requests_available"] == pytest.approx(0.4)
    assert gpt["tokens_available"] == pytest.approx(20)
    assert gpt["blocked_until"] is None
    assert [(w["run_id"], w["thread_id"]) for w in gpt["waiting"]] == [
        ("run-a", "ta"),
        ("run-b", "tb"),
    ]
    assert gpt["waiting"][0]["since"] == "2026-01-01T00:00:00Z"
    # tenants see every key, and only the runs of their own threads
    for tenant, thread in (("alpha", "ta"), ("beta", "tb")):
        keys = [b["key"] for b in seen[tenant]["rate_limits"]]
        assert keys == ["anthropic:claude", "openai:gpt-4o"]
        assert [w["thread_id"] for w in seen[tenant]["rate_limits"][1]["waiting"]] == [thread]


def _keyed(i: int, key: str, limit: int) -> Dispatch:
    return Dispatch(
        dispatch_id=f"d-{key}-{i}", thread_id=f"t-{key}-{i}", kind="start",
        concurrency_key=key, concurrency_limit=limit,
    )  # fmt: skip


@pytest.mark.asyncio
async def test_metrics_and_limits_list_show_the_concurrency_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    async with open_store(url) as store:
        for i in range(5):
            await store.enqueue(_keyed(i, "model:gpt", 2))
        await store.enqueue(_keyed(0, "tenant:acme", 4))
        async with running_api(store) as api:
            scrape = (await api.client(None).get("/metrics")).text
    gpt, acme = '{key="model:gpt"}', '{key="tenant:acme"}'
    assert sample(scrape, f"wakeful_concurrency_limit{gpt}") == 2.0
    assert sample(scrape, f"wakeful_concurrency_admitted{gpt}") == 2.0
    assert sample(scrape, f"wakeful_concurrency_waiting{gpt}") == 3.0
    assert sample(scrape, f"wakeful_concurrency_admitted{acme}") == 1.0
    assert sample(scrape, f"wakeful_concurrency_waiting{acme}") == 0.0
    listed = cli("limits", "list", "--json", store=url)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [
        {"kind": "concurrency", "key": "model:gpt", "limit": 2, "admitted": 2, "waiting": 3},
        {"kind": "concurrency", "key": "tenant:acme", "limit": 4, "admitted": 1, "waiting": 0},
    ]
    shown = cli("limits", "list", store=url)
    assert shown.returncode == 0, shown.stderr
    assert "concurrency keys" in shown.stdout and "model:gpt" in shown.stdout
    waiting = cli("dispatches", "list", "--status", "waiting_key", "--json", store=url)
    assert waiting.returncode == 0, waiting.stderr
    rows = json.loads(waiting.stdout)
    assert [d["dispatch_id"] for d in rows] == [f"d-model:gpt-{i}" for i in (2, 3, 4)]
