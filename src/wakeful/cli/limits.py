"""``wakeful limits list``: the rate-limit buckets and the concurrency keys the store keeps
(docs/flow-control.md)."""

from __future__ import annotations

from typing import Any

import click

from wakeful.cli.common import (
    builtins,
    emit,
    json_option,
    run_async,
    store_option,
    store_url,
    table,
    with_store,
)
from wakeful.concurrency import KeyUse
from wakeful.errors import UnsupportedStore
from wakeful.limits import LimitBucket
from wakeful.store.contract import ConcurrencyStore, RateLimitStore


@click.group()
def limits() -> None:
    """Inspect the rate limits shared by the fleet (see docs/flow-control.md)."""


async def _buckets(store: Any) -> tuple[list[LimitBucket], list[KeyUse]]:
    if not isinstance(store, RateLimitStore):
        raise UnsupportedStore(type(store).__name__, "this store keeps no rate-limit buckets")
    keys = await store.concurrency_keys() if isinstance(store, ConcurrencyStore) else []
    return await store.limit_buckets(), keys


def _amount(value: float | None, rate: float | None) -> str:
    if value is None or rate is None:
        return "-"
    return f"{value:.1f} of {rate:g}/min"


def _waiting(runs: list[str]) -> str:
    """How many runs wait, and the oldest few."""
    if not runs:
        return "-"
    shown = ", ".join(runs[:3])
    return f"{len(runs)}: {shown}" + (", ..." if len(runs) > 3 else "")


@limits.command("list")
@store_option
@json_option
@run_async
async def limits_list(store: str | None, as_json: bool) -> None:
    """Every rate-limit key used on the store: its rates, what its bucket holds now, the
    end of a provider's block (a 429), if one holds it, and the runs waiting for it; then
    every concurrency key in use: its limit, how many of its runs are admitted and how many
    wait. In ``--json``, one list: ``kind`` is ``rate`` or ``concurrency``."""
    found, keys = await with_store(store_url(store), _buckets, existing=True)

    def render(_: object) -> None:
        table(
            "rate limits",
            ["key", "requests available", "tokens available", "blocked until", "waiting"],
            [
                (
                    b.key,
                    _amount(b.requests_available, b.requests_per_minute),
                    _amount(b.tokens_available, b.tokens_per_minute),
                    "-" if b.blocked_until is None else b.blocked_until.isoformat(),
                    _waiting([w.run_id for w in b.waiting]),
                )
                for b in found
            ],
        )
        if keys:
            table(
                "concurrency keys",
                ["key", "limit", "admitted", "waiting"],
                [(k.key, str(k.limit), str(k.admitted), str(k.waiting)) for k in keys],
            )

    rows = [{"kind": "rate", **builtins(b)} for b in found]
    rows += [{"kind": "concurrency", **builtins(k)} for k in keys]
    emit(rows, as_json, render)
