"""Durable sleep (``ctx.sleep``): what a sleeping run records and how it is woken.

A run is *asleep* when every ticket it suspended on is a sleep's. Its suspending commit
records the wake time (``metadata["wake_at"]``) and settles the worker's dispatch with
``Retry(delay)``: the same dispatch becomes claimable when the store's clock reaches the
wake time, in the same atomic step that recorded the sleep, so no wake-up can be lost and
no process waits. The claimant that wakes it answers the sleep tickets that are due
(``wake_answers``) and resumes the run. ``metadata["sleeps"]`` counts the run's sleeps: a
wake-up is a claim of the dispatch but not a failed attempt (``attempts_spent``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from wakeful.records import Awaiting, Checkpoint, Dispatch, EventDraft, Retry
from wakeful.runtime.context import SLEEP_SCHEMA, Ticket, sleep_ticket_wake


def asleep_until(tickets: tuple[Ticket, ...]) -> datetime | None:
    """The earliest wake time when every ticket is a sleep's, else ``None``."""
    wakes = [sleep_ticket_wake(t) for t in tickets]
    if not wakes or any(w is None for w in wakes):
        return None
    return min(w for w in wakes if w is not None)


def sleep_metadata(cp: Checkpoint, wake_at: datetime | None) -> dict[str, Any]:
    if wake_at is None:
        return {}
    return {"wake_at": wake_at.isoformat(), "sleeps": sleeps(cp) + 1}


def sleeps(cp: Checkpoint | None) -> int:
    """How many times the run of ``cp`` has slept so far."""
    if cp is None:
        return 0
    count = cp.metadata.get("sleeps", 0)
    return count if isinstance(count, int) else 0


def suspension_event(
    run_id: str, tickets: tuple[Ticket, ...], wake_at: datetime | None
) -> EventDraft:
    data: dict[str, Any] = {"tickets": [t.id for t in tickets]}
    if wake_at is None:
        return EventDraft(type="run.suspended", data=data, run_id=run_id)
    return EventDraft(
        type="run.sleeping", data={**data, "wake_at": wake_at.isoformat()}, run_id=run_id
    )


def sleep_ending(wake_at: datetime | None, now: datetime) -> Awaiting | Retry:
    """How the sleeping (or suspending) run settles its dispatch."""
    if wake_at is None:
        return Awaiting()
    return Retry(max((wake_at - now).total_seconds(), 0.0), None)


def wake_at(cp: Checkpoint | None) -> datetime | None:
    """When the suspended run of ``cp`` wakes, or ``None`` if it is not asleep (suspended
    on a ticket other than a sleep's: ``wake_at`` stays in the metadata after a sleep)."""
    if cp is None or cp.status != "suspended":
        return None
    tickets = cp.metadata.get("tickets")
    if not tickets or any(
        not isinstance(t, dict) or t.get("schema") != SLEEP_SCHEMA for t in tickets
    ):
        return None
    raw = cp.metadata.get("wake_at")
    return datetime.fromisoformat(raw) if isinstance(raw, str) else None


def wake_answers(cp: Checkpoint, now: datetime) -> dict[str, Any]:
    """The answers that wake the sleeping run of ``cp`` at ``now``: every sleep ticket due
    by then, and at least the earliest (the store's clock, which decided that the wake-up
    is due, may be ahead of this process's)."""
    tickets = [t for t in cp.metadata.get("tickets", []) if t.get("schema") == SLEEP_SCHEMA]
    timed = sorted(
        (datetime.fromisoformat(t["question"]["sleep_until"]), str(t["id"])) for t in tickets
    )
    due = {ident: at.isoformat() for at, ident in timed if at <= now}
    if not due and timed:
        at, ident = timed[0]
        due[ident] = at.isoformat()
    return due


def attempts_spent(d: Dispatch, cp: Checkpoint | None) -> bool:
    """Whether ``d``'s attempt budget is spent, not counting the claims that woke its run
    (``cp`` is the thread's latest checkpoint when it belongs to ``d``'s run)."""
    return d.attempts - sleeps(cp) > d.max_attempts


__all__ = [
    "asleep_until",
    "attempts_spent",
    "sleep_ending",
    "sleep_metadata",
    "sleeps",
    "suspension_event",
    "wake_answers",
    "wake_at",
]
