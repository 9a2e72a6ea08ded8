"""Read-mostly commands: threads, dispatches, quarantine, workers."""

from __future__ import annotations

from typing import Any

import click
import msgspec

from wakeful.cli.common import (
    console,
    emit,
    json_option,
    run_async,
    store_option,
    store_url,
    table,
    with_store,
)
from wakeful.errors import NotFound


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value)


@click.group()
def threads() -> None:
    """Inspect threads."""


@threads.command("list")
@store_option
@json_option
@click.option("--tenant", default=None)
@click.option("--after", default=None, help="Cursor: the last thread id of the previous page.")
@click.option("--limit", default=50, show_default=True)
@run_async
async def threads_list(
    store: str | None, as_json: bool, tenant: str | None, after: str | None, limit: int
) -> None:
    rows = await with_store(
        store_url(store), lambda s: s.list_threads(tenant=tenant, after=after, limit=limit)
    )
    emit(
        _builtins(rows),
        as_json,
        lambda _: table(
            "threads",
            ["thread", "tenant", "status", "version", "messages", "last seq", "updated"],
            [
                (
                    r.thread_id,
                    r.tenant,
                    r.status,
                    r.version,
                    r.message_count,
                    r.last_seq,
                    r.updated_at.isoformat(timespec="seconds"),
                )
                for r in rows
            ],
        ),
    )


@threads.command("show")
@click.argument("thread_id")
@store_option
@json_option
@run_async
async def threads_show(thread_id: str, store: str | None, as_json: bool) -> None:
    snap = await with_store(store_url(store), lambda s: s.read(thread_id))
    if snap is None:
        raise NotFound("thread", thread_id)

    def render(_: Any) -> None:
        cp = snap.checkpoint
        claim = snap.claim
        console.print(f"[bold]{thread_id}[/bold]  version {snap.version}  tenant {snap.tenant}")
        if cp is not None:
            console.print(f"run {cp.run_id}  status [bold]{cp.status}[/bold]  checkpoint {cp.id}")
            console.print_json(data=cp.state)
        if claim is not None:
            console.print(f"claim: {claim.holder} token {claim.token} until {claim.expires_at}")
        console.print(f"messages {snap.message_count}  events 1..{snap.last_seq}")

    emit(_builtins(snap), as_json, render)


@threads.command("events")
@click.argument("thread_id")
@store_option
@json_option
@click.option("--after", default=0, show_default=True)
@click.option("--limit", default=100, show_default=True)
@run_async
async def threads_events(
    thread_id: str, store: str | None, as_json: bool, after: int, limit: int
) -> None:
    events = await with_store(store_url(store), lambda s: s.events_after(thread_id, after, limit))
    emit(
        _builtins(events),
        as_json,
        lambda _: table(
            f"events of {thread_id}",
            ["seq", "at", "type", "run", "data"],
            [
                (
                    e.seq,
                    e.at.isoformat(timespec="seconds"),
                    e.type,
                    e.run_id,
                    msgspec.json.encode(e.data).decode()[:60],
                )
                for e in events
            ],
        ),
    )


DISPATCH_COLUMNS = ["dispatch", "thread", "kind", "status", "attempts", "holder", "last error"]


def _dispatch_rows(rows: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (
            d.dispatch_id,
            d.thread_id,
            d.kind,
            d.status,
            f"{d.attempts}/{d.max_attempts}",
            d.holder,
            d.last_error,
        )
        for d in rows
    ]


@click.group()
def dispatches() -> None:
    """Inspect the dispatch queue."""


@dispatches.command("list")
@store_option
@json_option
@click.option(
    "--status",
    type=click.Choice(["pending", "leased", "awaiting", "done", "quarantined"]),
    default=None,
)
@click.option("--thread", "thread_id", default=None)
@click.option("--after", default=None)
@click.option("--limit", default=50, show_default=True)
@run_async
async def dispatches_list(
    store: str | None,
    as_json: bool,
    status: Any,
    thread_id: str | None,
    after: str | None,
    limit: int,
) -> None:
    rows = await with_store(
        store_url(store),
        lambda s: s.list_dispatches(status=status, thread_id=thread_id, after=after, limit=limit),
    )
    emit(
        _builtins(rows),
        as_json,
        lambda _: table("dispatches", DISPATCH_COLUMNS, _dispatch_rows(rows)),
    )


async def _get(store: Any, dispatch_id: str) -> Any:
    d = await store.get_dispatch(dispatch_id)
    if d is None:
        raise NotFound("dispatch", dispatch_id)
    return d


def _show_dispatch(d: Any, as_json: bool) -> None:
    def render(_: Any) -> None:
        table(f"dispatch {d.dispatch_id}", ["field", "value"], list(_builtins(d).items()))

    emit(_builtins(d), as_json, render)


@dispatches.command("show")
@click.argument("dispatch_id")
@store_option
@json_option
@run_async
async def dispatches_show(dispatch_id: str, store: str | None, as_json: bool) -> None:
    _show_dispatch(await with_store(store_url(store), lambda s: _get(s, dispatch_id)), as_json)


@click.group()
def quarantine() -> None:
    """Operator actions on exhausted work (see docs/queue.md)."""


@quarantine.command("list")
@store_option
@json_option
@click.option("--limit", default=50, show_default=True)
@run_async
async def quarantine_list(store: str | None, as_json: bool, limit: int) -> None:
    rows = await with_store(
        store_url(store), lambda s: s.list_dispatches(status="quarantined", limit=limit)
    )
    emit(
        _builtins(rows),
        as_json,
        lambda _: table("quarantined", DISPATCH_COLUMNS, _dispatch_rows(rows)),
    )


@quarantine.command("show")
@click.argument("dispatch_id")
@store_option
@json_option
@run_async
async def quarantine_show(dispatch_id: str, store: str | None, as_json: bool) -> None:
    _show_dispatch(await with_store(store_url(store), lambda s: _get(s, dispatch_id)), as_json)


@quarantine.command("add")
@click.argument("dispatch_id")
@store_option
@json_option
@run_async
async def quarantine_add(dispatch_id: str, store: str | None, as_json: bool) -> None:
    """Quarantine exhausted work so it is not terminalised automatically."""
    _show_dispatch(await with_store(store_url(store), lambda s: s.quarantine(dispatch_id)), as_json)


@quarantine.command("requeue")
@click.argument("dispatch_id")
@store_option
@json_option
@run_async
async def quarantine_requeue(dispatch_id: str, store: str | None, as_json: bool) -> None:
    """Make quarantined work pending again with a fresh retry budget."""
    _show_dispatch(await with_store(store_url(store), lambda s: s.requeue(dispatch_id)), as_json)


@quarantine.command("purge")
@click.argument("dispatch_id")
@store_option
@json_option
@click.confirmation_option(prompt="Delete this dispatch for good?")
@run_async
async def quarantine_purge(dispatch_id: str, store: str | None, as_json: bool) -> None:
    """Delete quarantined (or done) work for good."""
    await with_store(store_url(store), lambda s: s.purge(dispatch_id))
    emit({"purged": dispatch_id}, as_json, lambda _: console.print(f"purged {dispatch_id}"))


@click.group()
def workers() -> None:
    """Inspect the worker registry."""


@workers.command("list")
@store_option
@json_option
@run_async
async def workers_list(store: str | None, as_json: bool) -> None:
    rows = await with_store(store_url(store), lambda s: s.list_workers())
    emit(
        _builtins(rows),
        as_json,
        lambda _: table(
            "workers",
            ["worker", "generation", "incarnation", "registered", "last heartbeat"],
            [
                (
                    w.worker_id,
                    w.generation,
                    w.incarnation_id[:12],
                    w.registered_at.isoformat(timespec="seconds"),
                    w.last_heartbeat.isoformat(timespec="seconds"),
                )
                for w in rows
            ],
        ),
    )
