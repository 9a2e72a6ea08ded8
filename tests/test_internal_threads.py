"""The fleet's own threads (webhook deliveries on ``wakeful.webhook.*``, the relay's
``wakeful.relay``) are left out of thread listings unless asked for: the listing helper
(``wakeful.store.listing``) on every store, ``GET /v1/threads`` and ``wakeful threads
list``. A real delivery's thread is checked in tests/test_webhooks.py and
tests/test_webhooks_postgres.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.cli_support import cli
from tests.postgres_support import open_test_store
from tests.runtime_support import STORE_KINDS, open_kind
from tests.server_support import OPERATOR, running_api, seed_thread
from wakeful import ManualClock, open_store
from wakeful.store.contract import Store
from wakeful.store.listing import is_internal_thread, list_threads
from wakeful.store.memory import MemoryStore

pytest_plugins = ["tests.postgres_fixtures"]

INTERNAL = [f"wakeful.webhook.msg_{i:02d}" for i in range(25)] + [
    "wakeful.relay",
    "langgraph:thread:6f1c",
]
USERS = ["a-1", "a-2", "wakeful.webhooks", "wakeful.webhookz", "z-1", "langgraph:threads"]
"""Ids of users' threads, two of them next to the internal range."""


async def seeded(store: Store) -> None:
    for thread_id in sorted(INTERNAL + USERS):
        await seed_thread(store, thread_id)


@pytest_asyncio.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with await open_kind(request.param, tmp_path, ManualClock()) as opened:
        yield opened


def test_which_ids_are_internal() -> None:
    assert all(is_internal_thread(t) for t in INTERNAL)
    assert not any(is_internal_thread(t) for t in USERS)
    assert not is_internal_thread("wakeful.relays") and not is_internal_thread("my.wakeful.relay")


@pytest.mark.asyncio
async def test_listings_leave_internal_threads_out_unless_asked_on_every_store(
    store: Store,
) -> None:
    await check_listing(store)


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_listings_leave_internal_threads_out_on_postgresql(pg_databases: Any) -> None:
    store = await open_test_store(await pg_databases.clone())
    try:
        await check_listing(store)
    finally:
        await store.close()


async def check_listing(store: Store) -> None:
    await seeded(store)
    every = [t.thread_id for t in await store.list_threads(limit=100)]
    assert every == sorted(INTERNAL + USERS), "the store itself lists them all"
    assert [t.thread_id for t in await list_threads(store)] == sorted(USERS)
    assert [t.thread_id for t in await list_threads(store, internal=True)] == every
    # pages of two, through the internal range: nothing lost, nothing twice, short = end
    seen: list[str] = []
    after = None
    while True:
        page = await list_threads(store, after=after, limit=2)
        seen += [t.thread_id for t in page]
        if len(page) < 2:
            break
        after = page[-1].thread_id
    assert seen == sorted(USERS)
    page = await list_threads(store, after="langgraph:threads", limit=1)
    assert [t.thread_id for t in page] == ["wakeful.webhooks"]


@pytest.mark.asyncio
async def test_the_http_list_hides_internal_threads_unless_internal_is_true() -> None:
    async with running_api(MemoryStore()) as api:
        await seeded(api.store)
        operator = api.client(OPERATOR)

        async def listed(**params: str) -> list[str]:
            seen: list[str] = []
            after = None
            while True:
                query: dict[str, str | int] = {**params, "limit": 3}
                if after:
                    query["after"] = after
                r = await operator.get("/v1/threads", params=query)
                assert r.status_code == 200, r.text
                page = r.json()
                seen += [t["thread_id"] for t in page["threads"]]
                if page["next_after"] is None:
                    return seen
                after = page["next_after"]

        assert await listed() == sorted(USERS)
        assert await listed(internal="true") == sorted(INTERNAL + USERS)
        assert await listed(prefix="wakeful.webhook") == ["wakeful.webhooks", "wakeful.webhookz"]


def test_the_cli_list_hides_internal_threads_unless_internal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    async def prepare() -> None:
        async with open_store(url) as s:
            await seeded(s)

    asyncio.run(prepare())
    plain = json.loads(cli("threads", "list", "--json", store=url).stdout)
    assert [t["thread_id"] for t in plain] == sorted(USERS)
    every = json.loads(cli("threads", "list", "--internal", "--json", store=url).stdout)
    assert [t["thread_id"] for t in every] == sorted(INTERNAL + USERS)
    few = json.loads(cli("threads", "list", "--limit", "3", "--json", store=url).stdout)
    assert [t["thread_id"] for t in few] == sorted(USERS)[:3]
