"""Read-only commands: threads, dispatches, workers. Every listing takes ``--json``; payloads
and states render as JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from wakeful.cli.common import (
    builtins,
    cell,
    console,
    emit,
    json_option,
    limit_option,
    print_line,
    run_async,
    show_dispatch,
    store_option,
    store_url,
    table,
    with_store,
)
from wakeful.cli.follow import follow_events
from wakeful.errors import NotFound
from wakeful.records import Dispatch, Event, ThreadSnapshot
from wakeful.store.listing import list_threads
from wakeful.store.validate_queue import DISPATCH_STATUSES


def _at(value: datetime | None) -> str:
    return "" if value is None else value.isoformat(timespec="seconds")


async def _snapshot(store: Any, thread_id: str) -> ThreadSnapshot:
    snap = await store.read(thread_id)
    if snap is None:
        raise NotFound("thread", thread_id)
    return snap  # type: ignore[no-any-return]


@click.group()
def threads() -> None:
    """Inspect threads: list, show, events, messages, runs."""


@threads.command("list")
@store_option
@json_option
@click.option("--tenant", default=None, help="Only this tenant's threads.")
@click.option("--after", default=None, help="Cursor: the last thread id of the previous page.")
@click.option(
    "--internal",
    is_flag=True,
    help="Also the fleet's own threads (webhook deliveries, wakeful.webhook.*).",
)
@limit_option()
@run_async
async def threads_list(
    store: str | None,
    as_json: bool,
    tenant: str | None,
    after: str | None,
    internal: bool,
    limit: int,
) -> None:
    """Threads with at least one commit, by id (without the fleet's own threads unless
    --internal)."""
    rows = await with_store(
        store_url(store),
        lambda s: list_threads(s, tenant=tenant, after=after, limit=limit, internal=internal),
        existing=True,
    )
    emit(
        builtins(rows),
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
                    _at(r.updated_at),
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
    """The thread's latest checkpoint (status, state, open tickets), claim and counts."""
    snap = await with_store(store_url(store), lambda s: _snapshot(s, thread_id), existing=True)

    def render(_: Any) -> None:
        from wakeful.runtime.sleeps import wake_at

        cp = snap.checkpoint
        claim = snap.claim
        print_line(f"[bold]{thread_id}[/bold]  version {snap.version}  tenant {cell(snap.tenant)}")
        if cp is not None:
            waking = wake_at(cp)
            status = cp.status if waking is None else f"sleeping until {_at(waking)}"
            print_line(f"run {cp.run_id}  status [bold]{status}[/bold]  checkpoint {cp.id}")
            console.print_json(data=builtins(cp.state))
            tickets = cp.metadata.get("tickets") if cp.status == "suspended" else None
            for ticket in tickets or []:
                if isinstance(ticket, dict):
                    print_line(f"open ticket {ticket.get('id')}: {cell(ticket.get('question'))}")
        if claim is not None:
            print_line(f"claim: {claim.holder} token {claim.token} until {_at(claim.expires_at)}")
        print_line(f"messages {snap.message_count}  events 1..{snap.last_seq}")

    emit(builtins(snap), as_json, render)


def event_row(e: Event, width: int | None = 80) -> tuple[Any, ...]:
    return (e.seq, _at(e.at), e.type, e.run_id, cell(e.data, width))


EVENT_COLUMNS = ["seq", "at", "type", "run", "data"]


@threads.command("events")
@click.argument("thread_id")
@store_option
@json_option
@click.option("--after", default=0, show_default=True, help="Only events after this seq.")
@limit_option(100)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep printing new events as they are committed (one line, or one JSON object, "
    "each) until interrupted; reconnects to the store after it was unavailable.",
)
@run_async
async def threads_events(
    thread_id: str, store: str | None, as_json: bool, after: int, limit: int, follow: bool
) -> None:
    """The thread's durable events. Exit 3 when the thread does not exist."""
    url = store_url(store)
    if follow:
        await follow_events(url, thread_id, after, as_json)
        return

    async def read(s: Any) -> list[Event]:
        await _snapshot(s, thread_id)
        return await s.events_after(thread_id, after, limit)  # type: ignore[no-any-return]

    events = await with_store(url, read, existing=True)
    emit(
        builtins(events),
        as_json,
        lambda _: table(f"events of {thread_id}", EVENT_COLUMNS, [event_row(e) for e in events]),
    )


@threads.command("messages")
@click.argument("thread_id")
@store_option
@json_option
@click.option("--after", default=0, show_default=True, help="Skip this many messages.")
@limit_option(100)
@run_async
async def threads_messages(
    thread_id: str, store: str | None, as_json: bool, after: int, limit: int
) -> None:
    """The thread's conversation messages in order."""

    async def read(s: Any) -> list[Any]:
        await _snapshot(s, thread_id)
        return await s.messages(thread_id, after, limit)  # type: ignore[no-any-return]

    messages = await with_store(store_url(store), read, existing=True)
    emit(
        builtins(messages),
        as_json,
        lambda _: table(
            f"messages of {thread_id}",
            ["#", "role", "run", "content", "tool calls"],
            [
                (
                    after + i + 1,
                    m.role,
                    m.run_id,
                    cell(m.content, 100),
                    cell(m.tool_calls or None, 60),
                )
                for i, m in enumerate(messages)
            ],
        ),
    )


@threads.command("runs")
@click.argument("thread_id")
@store_option
@json_option
@limit_option(20)
@run_async
async def threads_runs(thread_id: str, store: str | None, as_json: bool, limit: int) -> None:
    """The thread's runs, newest first, from its checkpoint history (retention may have
    removed old checkpoints)."""

    from wakeful.runtime.sleeps import wake_at

    async def read(s: Any) -> list[dict[str, Any]]:
        await _snapshot(s, thread_id)
        runs: list[dict[str, Any]] = []
        before: str | None = None
        while True:
            page = await s.checkpoints(thread_id, before=before, limit=200)
            for cp, at in page:
                if runs and runs[-1]["run_id"] == cp.run_id:
                    runs[-1]["started_at"] = at
                    runs[-1]["checkpoints"] += 1
                    continue
                if len(runs) == limit:
                    return runs
                # the newest checkpoint is the thread's latest: its run may be asleep
                waking = wake_at(cp) if not runs and before is None else None
                runs.append(
                    {
                        "run_id": cp.run_id,
                        "status": cp.status if waking is None else "sleeping",
                        "wake_at": waking,
                        "graph": cp.metadata.get("graph"),
                        "started_at": at,
                        "updated_at": at,
                        "checkpoints": 1,
                    }
                )
            if len(page) < 200:
                return runs
            before = page[-1][0].id

    runs = await with_store(store_url(store), read, existing=True)
    emit(
        builtins(runs),
        as_json,
        lambda _: table(
            f"runs of {thread_id}",
            ["run", "status", "graph", "started", "updated", "checkpoints"],
            [
                (
                    r["run_id"],
                    r["status"] if r["wake_at"] is None else f"sleeping until {_at(r['wake_at'])}",
                    r["graph"],
                    _at(r["started_at"]),
                    _at(r["updated_at"]),
                    r["checkpoints"],
                )
                for r in runs
            ],
        ),
    )


DISPATCH_COLUMNS = ["dispatch", "thread", "kind", "status", "attempts", "holder", "last error"]


def dispatch_rows(rows: list[Dispatch]) -> list[tuple[Any, ...]]:
    from wakeful.fleet.delays import waits_until

    return [
        (
            d.dispatch_id,
            d.thread_id,
            d.kind,
            d.status if (at := waits_until(d)) is None else f"{d.status} until {_at(at)}",
            f"{d.attempts}/{d.max_attempts}",
            d.holder,
            d.last_error,
        )
        for d in rows
    ]


async def get_dispatch(store: Any, dispatch_id: str) -> Dispatch:
    d = await store.get_dispatch(dispatch_id)
    if d is None:
        raise NotFound("dispatch", dispatch_id)
    return d  # type: ignore[no-any-return]


@click.group()
def dispatches() -> None:
    """Inspect the dispatch queue."""


@dispatches.command("list")
@store_option
@json_option
@click.option(
    "--status",
    type=click.Choice(sorted(DISPATCH_STATUSES)),
    default=None,
    help="Only dispatches with this status.",
)
@click.option("--thread", "thread_id", default=None, help="Only this thread's dispatches.")
@click.option("--after", default=None, help="Cursor: the last dispatch id of the previous page.")
@limit_option()
@run_async
async def dispatches_list(
    store: str | None,
    as_json: bool,
    status: Any,
    thread_id: str | None,
    after: str | None,
    limit: int,
) -> None:
    """Dispatches in enqueue order."""
    rows = await with_store(
        store_url(store),
        lambda s: s.list_dispatches(status=status, thread_id=thread_id, after=after, limit=limit),
        existing=True,
    )
    emit(
        builtins(rows),
        as_json,
        lambda _: table("dispatches", DISPATCH_COLUMNS, dispatch_rows(rows)),
    )


@dispatches.command("show")
@click.argument("dispatch_id")
@store_option
@json_option
@run_async
async def dispatches_show(dispatch_id: str, store: str | None, as_json: bool) -> None:
    """One dispatch with its payload and delivery state."""
    show_dispatch(
        await with_store(store_url(store), lambda s: get_dispatch(s, dispatch_id), existing=True),
        as_json,
    )


@click.group()
def workers() -> None:
    """Inspect the worker registry."""


@workers.command("list")
@store_option
@json_option
@click.option(
    "--all", "show_all", is_flag=True, help="Also workers that stopped or whose heartbeat expired."
)
@click.option(
    "--stale-after",
    default=60.0,
    show_default=True,
    help="Seconds without a heartbeat after which a worker counts as expired.",
)
@run_async
async def workers_list(
    store: str | None, as_json: bool, show_all: bool, stale_after: float
) -> None:
    """Live workers (with --all: every registered worker and its state: alive, expired, or
    stopped, when it recorded a graceful stop)."""
    from wakeful.fleet.census import liveness

    rows = await with_store(store_url(store), lambda s: s.list_workers(), existing=True)
    now = datetime.now(UTC)
    listed = [{**builtins(w), "state": liveness(w, now, stale_after)} for w in rows]
    if not show_all:
        listed = [w for w in listed if w["state"] == "alive"]
    emit(
        listed,
        as_json,
        lambda _: table(
            "workers" if show_all else "live workers",
            [
                "worker",
                "state",
                "version",
                "generation",
                "incarnation",
                "registered",
                "last heartbeat",
                "stopped",
            ],
            [
                (
                    w["worker_id"],
                    w["state"],
                    w["version"] or "",
                    w["generation"],
                    w["incarnation_id"],
                    w["registered_at"],
                    w["last_heartbeat"],
                    w["stopped_at"] or "",
                )
                for w in listed
            ],
        ),
    )
