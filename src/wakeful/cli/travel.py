"""Time travel on the command line (docs/time-travel.md): ``wakeful threads history``,
``threads checkpoint``, ``threads update`` and ``threads fork``; replaying from a
checkpoint is ``wakeful submit ... --from-checkpoint CP``.

Like the other commands these act on the store directly, as an operator: for the thread's
own tenant, whatever it is. Writes print one line (``--json``: the record)."""

from __future__ import annotations

from typing import Any

import click

from wakeful.cli.apps import load_registry
from wakeful.cli.common import (
    EXIT_INVALID,
    builtins,
    cell,
    console,
    emit,
    fail,
    json_option,
    limit_option,
    parse_json,
    print_line,
    run_async,
    store_option,
    store_url,
    table,
    with_store,
)
from wakeful.cli.inspect import threads
from wakeful.errors import InvalidState, NotFound
from wakeful.records import ThreadSnapshot


async def owner_tenant(store: Any, thread_id: str) -> str | None:
    """The tenant the thread is bound to (the commands act for it); ``NotFound`` for a
    thread without history."""
    snap: ThreadSnapshot | None = await store.read(thread_id)
    if snap is None or snap.checkpoint is None:
        raise NotFound("thread", thread_id)
    return snap.tenant if snap.tenant_bound else None


def _mark(entry: Any) -> str:
    """``*`` the head, ``|`` on the head's line, ``x`` on an abandoned branch."""
    return "*" if entry.head else ("|" if entry.current else "x")


@threads.command("history")
@click.argument("thread_id")
@store_option
@json_option
@click.option("--before", default=None, help="Cursor: the last checkpoint id of the page before.")
@limit_option(50)
@run_async
async def threads_history(
    thread_id: str, store: str | None, as_json: bool, before: str | None, limit: int
) -> None:
    """The thread's checkpoints, newest first: branch, * head / | on the head's line / x
    abandoned, run, step, producing nodes, status, source, message count; then where each
    branch forked."""
    from wakeful.runtime.history import history, thread_branches

    async def read(s: Any) -> tuple[Any, Any]:
        tenant = await owner_tenant(s, thread_id)
        entries = await history(s, thread_id, before=before, limit=limit, tenant=tenant)
        return entries, await thread_branches(s, thread_id, tenant=tenant)

    entries, branches = await with_store(store_url(store), read, existing=True)

    def render(_: Any) -> None:
        table(
            f"history of {thread_id}",
            ["", "checkpoint", "branch", "run", "step", "nodes", "status", "source", "msgs", "at"],
            [
                (
                    _mark(e),
                    e.checkpoint_id,
                    e.branch,
                    e.run_id,
                    cell(e.step),
                    ",".join(e.nodes),
                    e.status,
                    cell(e.source),
                    cell(e.messages),
                    e.created_at.isoformat(timespec="seconds"),
                )
                for e in entries
            ],
        )
        for b in branches:
            print_line(
                f"branch {b.number} from {b.fork_point} (branch {b.parent}), left {b.old_head}"
            )
        if len(entries) == limit:
            print_line(f"older: --before {entries[-1].checkpoint_id}")

    emit({"entries": builtins(entries), "branches": builtins(branches)}, as_json, render)


@threads.command("checkpoint")
@click.argument("thread_id")
@click.argument("checkpoint_id")
@store_option
@json_option
@limit_option(100)
@run_async
async def threads_checkpoint(
    thread_id: str, checkpoint_id: str, store: str | None, as_json: bool, limit: int
) -> None:
    """One checkpoint in full (its history entry, state, frontier) and the thread's
    messages as of it, on whichever branch it is."""
    from wakeful.runtime.history import checkpoint_at, messages_at

    async def read(s: Any) -> tuple[Any, Any]:
        tenant = await owner_tenant(s, thread_id)
        found = await checkpoint_at(s, thread_id, checkpoint_id, tenant=tenant)
        try:
            said = await messages_at(s, thread_id, checkpoint_id, limit=limit, tenant=tenant)
        except InvalidState:  # committed without a message count
            said = None
        return found, said

    found, said = await with_store(store_url(store), read, existing=True)

    def render(_: Any) -> None:
        e, cp = found.entry, found.checkpoint
        where = "the head" if e.head else ("on the head's line" if e.current else "abandoned")
        print_line(
            f"[bold]{e.checkpoint_id}[/bold]  run {e.run_id}  step {cell(e.step)}  "
            f"status [bold]{e.status}[/bold]  branch {e.branch} ({where})  "
            f"nodes {','.join(e.nodes) or '-'}"
        )
        console.print_json(data=builtins(cp.state))
        if cp.frontier:
            print_line("next: " + ", ".join(str(t.get("node")) for t in cp.frontier))
        if said is None:
            print_line("messages as of it: unknown (committed without a message count)")
        elif said:
            table(
                "messages as of it",
                ["role", "content"],
                [(m.role, cell(m.content, 120)) for m in said],
            )

    data = {**builtins(found), "messages": builtins(said)}
    emit(data, as_json, render)


@threads.command("update")
@click.argument("thread_id")
@click.option("--values", "values_json", required=True, help="State fields, a JSON object.")
@click.option("--as-node", default=None, help="As if this node returned the values.")
@click.option(
    "--checkpoint", "checkpoint_id", default=None, help="Edit this checkpoint (it branches)."
)
@click.option(
    "--app",
    "app",
    required=True,
    metavar="MODULE:ATTR",
    help="The app whose graph the thread runs (its reducers apply the values).",
)
@store_option
@json_option
@run_async
async def threads_update(
    thread_id: str,
    values_json: str,
    as_node: str | None,
    checkpoint_id: str | None,
    app: str,
    store: str | None,
    as_json: bool,
) -> None:
    """Commit a new checkpoint whose state is --values applied through the graph's
    reducers to the head's state (or --checkpoint's, which branches the thread), as if
    --as-node had returned them. Refused (exit 4) while a run holds the thread or its last
    run is unfinished."""
    from wakeful.runtime import Runtime

    values = parse_json("--values", values_json)
    if not isinstance(values, dict):
        fail("--values must be a JSON object of state fields", EXIT_INVALID)
    registry = load_registry(app)

    async def write(s: Any) -> Any:
        tenant = await owner_tenant(s, thread_id)
        snap = await s.read(thread_id)
        graph = registry.for_checkpoint(snap.checkpoint).graph
        return await Runtime(s).update_state(
            thread_id, graph, values, as_node=as_node, checkpoint_id=checkpoint_id, tenant=tenant
        )

    cp = await with_store(store_url(store), write, existing=True)
    line = f"updated {thread_id}: checkpoint {cp.id} ({cp.status}) from {cp.parent}"
    if cp.frontier:
        line += ", next " + ",".join(str(t.get("node")) for t in cp.frontier)
    emit(builtins(cp), as_json, lambda _: click.echo(line))


@threads.command("fork")
@click.argument("thread_id")
@click.argument("new_thread_id")
@click.option(
    "--checkpoint",
    "checkpoint_id",
    default=None,
    help="Copy as of this checkpoint (default: the head).",
)
@store_option
@json_option
@run_async
async def threads_fork(
    thread_id: str, new_thread_id: str, checkpoint_id: str | None, store: str | None, as_json: bool
) -> None:
    """Create NEW_THREAD_ID with THREAD_ID's state and messages as of --checkpoint (the
    tenant is kept; THREAD_ID is only read). Refused (exit 4) when NEW_THREAD_ID has
    history."""
    from wakeful.runtime.history import fork

    async def write(s: Any) -> Any:
        tenant = await owner_tenant(s, thread_id)
        return await fork(s, thread_id, new_thread_id, checkpoint_id=checkpoint_id, tenant=tenant)

    cp = await with_store(store_url(store), write, existing=True)
    source = cp.metadata.get("forked_from", {}).get("checkpoint_id")
    line = f"forked {thread_id} at {source} into {new_thread_id} (checkpoint {cp.id}, {cp.status})"
    emit(builtins(cp), as_json, lambda _: click.echo(line))


__all__ = ["owner_tenant", "threads_checkpoint", "threads_fork", "threads_history"]
