"""Operator commands over the whole store: ``migrate``, ``prune``, ``status``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import click

from wakeful.cli.common import (
    builtins,
    console,
    describe_url,
    emit,
    json_option,
    run_async,
    store_at,
    store_option,
    store_url,
    table,
)
from wakeful.cli.progress import progress


def _is_postgres(url: str) -> bool:
    return urlsplit(url).scheme.lower() in ("postgresql", "postgres")


def schema_version(url: str) -> int | None:
    """The schema version of a store that opened (so it is at this wakeful's latest);
    ``None`` for stores without a schema (memory, file)."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("postgresql", "postgres"):
        from wakeful.store.postgres import latest_version

        return latest_version()
    if scheme == "sqlite":
        from wakeful.store.sqlite.migrations import shipped

        return len(shipped())
    return None


@click.command()
@store_option
@click.option("--schema", default="wakeful", show_default=True, help="PostgreSQL schema.")
@json_option
@run_async
async def migrate(store: str | None, schema: str, as_json: bool) -> None:
    """Apply the store's schema migrations (PostgreSQL; SQLite migrates when it opens)."""
    url = store_url(store)
    with progress("migrating", None, quiet=as_json):
        if _is_postgres(url):
            from wakeful.store.postgres import migrate as migrate_postgres

            version: int | None = await migrate_postgres(url, schema=schema)
        else:
            from wakeful import open_store

            async with open_store(url):
                version = schema_version(url)
    result = {"store": describe_url(url), "schema": schema if _is_postgres(url) else None}
    result["version"] = version  # type: ignore[assignment]

    def render(_: Any) -> None:
        if _is_postgres(url):
            console.print(f"schema {schema} at version {version}", highlight=False)
        else:
            console.print(
                f"{describe_url(url)} is migrated (embedded stores migrate when they open)",
                highlight=False,
            )

    emit(result, as_json, render)


def _seconds(text: str | None) -> float | None:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d`` -> seconds."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 15m, 12h or 7d") from None
    if value < 0:
        raise click.BadParameter(f"{text!r} is negative")
    return value


@click.command()
@store_option
@click.option(
    "--keep-checkpoints", type=int, default=None, help="Keep this many checkpoints per thread."
)
@click.option(
    "--checkpoint-age", default=None, metavar="AGE", help="Remove checkpoints older (7d, 12h...)."
)
@click.option("--keep-events", type=int, default=None, help="Keep this many events per thread.")
@click.option("--event-age", default=None, metavar="AGE", help="Remove events older than AGE.")
@click.option(
    "--receipt-age", default=None, metavar="AGE", help="Remove operation receipts older than AGE."
)
@click.option(
    "--dispatch-age",
    default=None,
    metavar="AGE",
    help="Remove settled (done) dispatches older than AGE.",
)
@json_option
@run_async
async def prune(
    store: str | None,
    keep_checkpoints: int | None,
    checkpoint_age: str | None,
    keep_events: int | None,
    event_age: str | None,
    receipt_age: str | None,
    dispatch_age: str | None,
    as_json: bool,
) -> None:
    """Remove superseded data by age and count. A thread's latest checkpoint, its pending
    writes, messages and inbox are never removed. Without any option nothing is removed."""
    from wakeful import RetentionPolicy

    policy = RetentionPolicy(
        keep_checkpoints=keep_checkpoints,
        checkpoint_max_age=_seconds(checkpoint_age),
        keep_events=keep_events,
        event_max_age=_seconds(event_age),
        receipt_max_age=_seconds(receipt_age),
        settled_dispatch_max_age=_seconds(dispatch_age),
    )
    async with store_at(store_url(store), existing=True) as opened:
        with progress("pruning", None, quiet=as_json):
            report = await opened.prune(policy)
    data = builtins(report)
    emit(data, as_json, lambda _: table("pruned", ["kind", "removed"], list(data.items())))


@click.command()
@store_option
@click.option(
    "--stale-after",
    default=60.0,
    show_default=True,
    help="Seconds without a heartbeat after which a worker is not counted as live.",
)
@json_option
@run_async
async def status(store: str | None, stale_after: float, as_json: bool) -> None:
    """The store at a glance: URL, schema version, queue depth by status, live workers and
    leases held."""
    from wakeful.fleet.census import liveness, queue_depth

    url = store_url(store)
    async with store_at(url, existing=True) as opened:
        depth = await queue_depth(opened)
        workers = await opened.list_workers()
    now = datetime.now(UTC)
    live = [w.worker_id for w in workers if liveness(w, now, stale_after) == "alive"]
    data = {
        "store": describe_url(url),
        "schema_version": schema_version(url),
        "queue": depth,
        "live_workers": live,
        "registered_workers": len(workers),
        "leases_held": depth["leased"],
    }

    def render(_: Any) -> None:
        rows: list[tuple[str, Any]] = [
            ("store", data["store"]),
            ("schema version", data["schema_version"] or "-"),
            *((f"queue: {k}", v) for k, v in depth.items()),
            ("live workers", f"{len(live)} of {len(workers)} registered"),
            ("leases held", depth["leased"]),
        ]
        table("wakeful status", ["", "value"], rows)
        if live:
            console.print("live: " + ", ".join(live), highlight=False)

    emit(data, as_json, render)
