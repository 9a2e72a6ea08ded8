"""Operators see the rate limits (issue 39 item 5): per-key gauges on the API's /metrics and
``wakeful limits list`` (table and --json), from the buckets the store holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.cli_support import cli, error_line
from tests.metrics_support import sample
from tests.server_support import running_api
from wakeful import ManualClock, open_store
from wakeful.limits import RateLimit
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
    async with running_api(store) as api:
        scrape = (await api.client(None).get("/metrics")).text
    gpt, claude = '{key="openai:gpt-4o"}', '{key="anthropic:claude"}'
    assert sample(scrape, f"wakeful_limit_requests_available{gpt}") == 1.0  # 2 - 1
    assert sample(scrape, f"wakeful_limit_tokens_available{gpt}") == 60.0  # 100 - 40
    assert sample(scrape, f"wakeful_limit_requests_per_minute{gpt}") == 120.0
    assert sample(scrape, f"wakeful_limit_tokens_per_minute{gpt}") == 6000.0
    assert sample(scrape, f"wakeful_limit_blocked_until_seconds{gpt}") == 0.0
    blocked = sample(scrape, f"wakeful_limit_blocked_until_seconds{claude}")
    assert blocked == datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC).timestamp()


@pytest.mark.asyncio
async def test_limits_list_shows_the_buckets_as_a_table_and_as_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'limits.db'}"
    async with open_store(url) as store:
        assert isinstance(store, RateLimitStore)
        await store.take_limit(GPT, 1, 40)
        await store.block_limit("anthropic:claude", 600)
    listed = cli("limits", "list", "--json", store=url)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["key"] for r in rows] == ["anthropic:claude", "openai:gpt-4o"]
    claude, gpt = rows
    assert claude["blocked_until"] is not None and gpt["blocked_until"] is None
    assert (gpt["requests_per_minute"], gpt["tokens_per_minute"]) == (120, 6000)
    assert 1.0 <= gpt["requests_available"] <= 2.0 and 60 <= gpt["tokens_available"] <= 100
    shown = cli("limits", "list", store=url)
    assert shown.returncode == 0, shown.stderr
    assert "openai:gpt-4o" in shown.stdout and "of 120/min" in shown.stdout
    missing = cli("limits", "list", store=f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 3 and "no store at" in error_line(missing)


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
