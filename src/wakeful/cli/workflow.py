"""Steering runs from outside: ``cancel``, ``resume``, ``send``. Each persists a dispatch
through the library calls (``wakeful.cancel``, ``wakeful.resume``, ``wakeful.send_message``)
for the workers and prints it; nothing runs here."""

from __future__ import annotations

from typing import Any

import click

from wakeful.cli.common import (
    EXIT_CONFLICT,
    EXIT_INVALID,
    fail,
    json_option,
    parse_json,
    run_async,
    show_dispatch,
    store_at,
    store_option,
    store_url,
    verbose_option,
)
from wakeful.errors import NotFound


async def _existing(store: Any, thread_id: str) -> Any:
    snap = await store.read(thread_id)
    if snap is None:
        raise NotFound("thread", thread_id)
    return snap


@click.command("cancel")
@click.argument("thread_id")
@click.option(
    "--reason", default="cancelled", show_default=True, help="Recorded with run.cancelled."
)
@store_option
@json_option
@verbose_option
@run_async
async def cancel_command(
    thread_id: str, reason: str, store: str | None, as_json: bool, verbose: bool
) -> None:
    """Cancel THREAD_ID's work: its running owner is fenced at its next commit and the next
    claimant records the run as cancelled. Prints the cancel dispatch's id (--verbose: the
    dispatch)."""
    from wakeful.fleet import cancel

    async with store_at(store_url(store), existing=True) as opened:
        await _existing(opened, thread_id)
        d = await cancel(opened, thread_id, reason)
    show_dispatch(d, as_json, f"cancelling {thread_id}: dispatch {d.dispatch_id}", verbose=verbose)


@click.command("resume")
@click.argument("thread_id")
@click.option(
    "--answers",
    required=True,
    metavar="JSON",
    help="Answers by ticket id, as a JSON object: '{\"ticket-id\": answer}'.",
)
@click.option("--dispatch-id", default=None, help="Idempotency key of the resume.")
@click.option("--tenant", default=None, help="The thread's tenant.")
@store_option
@json_option
@verbose_option
@run_async
async def resume_command(
    thread_id: str,
    answers: str,
    dispatch_id: str | None,
    tenant: str | None,
    store: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Answer the open tickets of THREAD_ID's suspended run; a worker continues it. Refused
    (exit 4) when the thread is not suspended or a ticket is not open."""
    from wakeful.fleet import resume

    parsed = parse_json("--answers", answers)
    if not isinstance(parsed, dict):
        fail("--answers must be a JSON object of ticket id -> answer", EXIT_INVALID)
    async with store_at(store_url(store), existing=True) as opened:
        snap = await _existing(opened, thread_id)
        cp = snap.checkpoint
        if cp is None or cp.status != "suspended":
            status = cp.status if cp is not None else "without a run"
            fail(
                f"thread {thread_id!r} is {status}, not suspended; nothing to resume", EXIT_CONFLICT
            )
        open_tickets = [t.get("id") for t in cp.metadata.get("tickets", []) if isinstance(t, dict)]
        unknown = sorted(set(parsed) - set(open_tickets))
        if unknown:
            fail(
                f"thread {thread_id!r} has no open tickets {unknown} (open: {open_tickets})",
                EXIT_CONFLICT,
            )
        d = await resume(opened, thread_id, parsed, dispatch_id=dispatch_id, tenant=tenant)
    show_dispatch(d, as_json, f"resuming {thread_id}: dispatch {d.dispatch_id}", verbose=verbose)


@click.command("send")
@click.argument("thread_id")
@click.argument("payload")
@click.option("--message-id", default=None, help="Deduplicates: the same id is delivered once.")
@click.option("--target", default=None, help="Run this target (default: the thread's graph).")
@click.option("--correlation-id", default=None, help="Carried with the message.")
@click.option("--tenant", default=None, help="The thread's tenant.")
@click.option("--text", "as_text", is_flag=True, help="PAYLOAD is text, not JSON.")
@store_option
@json_option
@verbose_option
@run_async
async def send_command(
    thread_id: str,
    payload: str,
    message_id: str | None,
    target: str | None,
    correlation_id: str | None,
    tenant: str | None,
    as_text: bool,
    store: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Deliver PAYLOAD (JSON, or text with --text) to THREAD_ID as a message from outside: it
    starts a run of the thread's graph (or --target) with the message as input, once per
    --message-id."""
    from wakeful.fleet import send_message

    value = payload if as_text else parse_json("PAYLOAD", payload)
    async with store_at(store_url(store)) as opened:
        d = await send_message(
            opened,
            thread_id,
            value,
            message_id=message_id,
            target=target,
            correlation_id=correlation_id,
            tenant=tenant,
        )
    line = f"sent {d.payload['message_id']} to {thread_id}: dispatch {d.dispatch_id}"
    show_dispatch(d, as_json, line, verbose=verbose)
