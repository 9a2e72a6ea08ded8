"""The HTTP paths that grew with data unrelated to them (issue 27) now cost a bounded number
of store calls: a tenant's dispatch page (one scoped listing, however much other tenants
hold) and a metrics scrape (one count call, however deep the queue)."""

from __future__ import annotations

import inspect
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pytest

from tests.server_support import ALPHA, BETA, OPERATOR, running_api
from wakeful.records import Dispatch
from wakeful.store.contract import Store
from wakeful.store.sqlite import open_sqlite_store


class Counting:
    """A store that counts the calls of each of its coroutine methods."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await attr(*args, **kwargs)

        return call


async def _fill(store: Store, count: int, tenant: str | None, prefix: str) -> None:
    for i in range(count):
        await store.enqueue(
            Dispatch(
                dispatch_id=f"{prefix}-{i}",
                thread_id=f"{prefix}-thread-{i}",
                kind="start",
                payload={"target": "echo"},
                tenant=tenant,
            )
        )


def _scrape_value(text: str, line_start: str) -> float:
    [line] = [x for x in text.splitlines() if x.startswith(line_start)]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.asyncio
async def test_a_tenant_page_costs_one_listing_whatever_other_tenants_hold(
    tmp_path: Path,
) -> None:
    async with await open_sqlite_store(f"sqlite:///{tmp_path / 's.db'}") as real:
        await _fill(real, 300, "beta", "b")
        await _fill(real, 3, "alpha", "a")
        counting = Counting(real)
        async with running_api(cast(Store, counting)) as api:
            alpha, beta = api.client(ALPHA), api.client(BETA)
            counting.calls.clear()
            page = (await alpha.get("/v1/dispatches", params={"limit": 50})).json()
            assert [d["dispatch_id"] for d in page["dispatches"]] == ["a-0", "a-1", "a-2"]
            assert page["next_after"] is None
            assert counting.calls == Counter(list_dispatches=1), counting.calls
            counting.calls.clear()
            empty = (await alpha.get("/v1/dispatches", params={"status": "done"})).json()
            assert empty == {"dispatches": [], "next_after": None}
            assert counting.calls == Counter(list_dispatches=1), counting.calls
            counting.calls.clear()
            paged = (await beta.get("/v1/dispatches", params={"limit": 100})).json()
            assert len(paged["dispatches"]) == 100 and paged["next_after"] == "b-99"
            assert counting.calls == Counter(list_dispatches=1), counting.calls


@pytest.mark.asyncio
async def test_a_metrics_scrape_is_one_count_call_whatever_the_queue_holds(
    tmp_path: Path,
) -> None:
    async with await open_sqlite_store(f"sqlite:///{tmp_path / 's.db'}") as real:
        await _fill(real, 1500, None, "p")
        counting = Counting(real)
        async with running_api(cast(Store, counting), queue_depth_bound=1000) as api:
            operator = api.client(OPERATOR)
            counting.calls.clear()
            text = (await operator.get("/metrics")).text
            # one count of the queue, whatever it holds, the worker registry (whose size is the
            # fleet's, not the queue's) for the live-workers gauge, the rate-limit buckets
            # (one row per configured key), the concurrency keys in use for their gauges, and
            # one page of the webhook threads for the webhooks gauge
            assert counting.calls == Counter(
                queue_depths=1,
                list_workers=1,
                limit_buckets=1,
                concurrency_keys=1,
                list_threads=1,
            ), counting.calls
            assert _scrape_value(text, 'wakeful_queue_depth{status="pending"}') == 1000
            assert _scrape_value(text, 'wakeful_queue_depth_capped{status="pending"}') == 1
            assert _scrape_value(text, 'wakeful_queue_depth{status="leased"}') == 0
            assert _scrape_value(text, 'wakeful_queue_depth_capped{status="leased"}') == 0
