"""The concurrency keys' gauges of ``/metrics`` (issue 39.5): per key in use, its limit,
its admitted runs and its waiting ones, read from the store at scrape time. Only keys with
admitted or waiting work are listed, so idle per-tenant keys leave the series."""

from __future__ import annotations

from wakeful.metrics import Gauge
from wakeful.store.contract import ConcurrencyStore


async def key_gauges(store: object) -> list[Gauge]:
    """The gauges of ``store``'s keys (a store without concurrency keys: none)."""
    if not isinstance(store, ConcurrencyStore):
        return []
    keys = await store.concurrency_keys()
    return [
        Gauge(
            "wakeful_concurrency_limit",
            "The limit of a concurrency key (the latest submission's).",
            ("key",),
            {(k.key,): float(k.limit) for k in keys},
        ),
        Gauge(
            "wakeful_concurrency_admitted",
            "Runs of a concurrency key admitted now (pending or leased).",
            ("key",),
            {(k.key,): float(k.admitted) for k in keys},
        ),
        Gauge(
            "wakeful_concurrency_waiting",
            "Runs of a concurrency key waiting for one of its slots (waiting_key).",
            ("key",),
            {(k.key,): float(k.waiting) for k in keys},
        ),
    ]
