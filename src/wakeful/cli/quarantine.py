"""Operator actions on exhausted work: ``quarantine list|show|add|requeue|purge`` (see
docs/queue.md)."""

from __future__ import annotations

import logging
from typing import Any

import click

from wakeful.cli.common import (
    builtins,
    console,
    emit,
    json_option,
    limit_option,
    run_async,
    show_dispatch,
    store_option,
    store_url,
    table,
    verbose_option,
    with_store,
)
from wakeful.cli.inspect import DISPATCH_COLUMNS, dispatch_rows, get_dispatch
from wakeful.cli.progress import progress

log = logging.getLogger("wakeful.cli")


def _logged(action: str, d: Any) -> Any:
    """Operator actions leave a log line (who changed the queue, and why it was parked)."""
    log.info(
        "dispatch %s %s (attempts %d of %d, last error: %s)",
        d.dispatch_id,
        action,
        d.attempts,
        d.max_attempts,
        d.last_error or "none",
        extra={"dispatch_id": d.dispatch_id, "thread_id": d.thread_id, "outcome": action},
    )
    return d


@click.group()
def quarantine() -> None:
    """Operator actions on exhausted work (see docs/queue.md)."""


@quarantine.command("list")
@store_option
@json_option
@limit_option()
@run_async
async def quarantine_list(store: str | None, as_json: bool, limit: int) -> None:
    """Quarantined dispatches."""
    rows = await with_store(
        store_url(store),
        lambda s: s.list_dispatches(status="quarantined", limit=limit),
        existing=True,
    )
    emit(
        builtins(rows),
        as_json,
        lambda _: table("quarantined", DISPATCH_COLUMNS, dispatch_rows(rows)),
    )


@quarantine.command("show")
@click.argument("dispatch_id")
@store_option
@json_option
@run_async
async def quarantine_show(dispatch_id: str, store: str | None, as_json: bool) -> None:
    """One quarantined dispatch with its payload and last error."""
    show_dispatch(
        await with_store(store_url(store), lambda s: get_dispatch(s, dispatch_id), existing=True),
        as_json,
    )


@quarantine.command("add")
@click.argument("dispatch_id")
@store_option
@json_option
@verbose_option
@run_async
async def quarantine_add(dispatch_id: str, store: str | None, as_json: bool, verbose: bool) -> None:
    """Quarantine exhausted work so it is not terminalised automatically. Prints one line
    (--verbose: the dispatch)."""
    parked = await with_store(store_url(store), lambda s: s.quarantine(dispatch_id), existing=True)
    line = f"quarantined {parked.dispatch_id} (thread {parked.thread_id})"
    show_dispatch(_logged("quarantined", parked), as_json, line, verbose=verbose)


@quarantine.command("requeue")
@click.argument("dispatch_id", required=False)
@click.option("--all", "every", is_flag=True, help="Requeue every quarantined dispatch.")
@store_option
@json_option
@verbose_option
@run_async
async def quarantine_requeue(
    dispatch_id: str | None, every: bool, store: str | None, as_json: bool, verbose: bool
) -> None:
    """Make quarantined work (DISPATCH_ID, or --all) pending again with a fresh retry
    budget."""
    if every == (dispatch_id is not None):
        raise click.UsageError("give either DISPATCH_ID or --all")
    if dispatch_id is not None:
        requeued = await with_store(
            store_url(store), lambda s: s.requeue(dispatch_id), existing=True
        )
        line = f"requeued {requeued.dispatch_id} (thread {requeued.thread_id})"
        show_dispatch(_logged("requeued", requeued), as_json, line, verbose=verbose)
        return

    async def requeue_all(s: Any) -> list[Any]:
        parked: list[Any] = []
        after = None
        while page := await s.list_dispatches(status="quarantined", after=after, limit=500):
            parked += page
            after = page[-1].dispatch_id
        done = []
        with progress("requeueing", len(parked), quiet=as_json) as advance:
            for d in parked:
                done.append(_logged("requeued", await s.requeue(d.dispatch_id)))
                advance(1)
        return done

    rows = await with_store(store_url(store), requeue_all, existing=True)
    emit(
        builtins(rows),
        as_json,
        lambda _: console.print(f"requeued {len(rows)} dispatches", highlight=False),
    )


@quarantine.command("purge")
@click.argument("dispatch_id")
@store_option
@json_option
@click.confirmation_option(prompt="Delete this dispatch for good?", help="Do not ask.")
@run_async
async def quarantine_purge(dispatch_id: str, store: str | None, as_json: bool) -> None:
    """Delete quarantined (or done) work for good."""
    await with_store(store_url(store), lambda s: s.purge(dispatch_id), existing=True)
    emit({"purged": dispatch_id}, as_json, lambda _: console.print(f"purged {dispatch_id}"))
