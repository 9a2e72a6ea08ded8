"""Firing schedule ticks in batches (issue 38 item 4): what a store that can fire many
schedules in one step offers ``wakeful.fire_due`` (``TickStore``), and the records it takes
and returns.

A batch is a list of ``Firing``: one schedule as it must be stored once its ticks are fired,
the revision it was read at, and the tick dispatches to enqueue with it. For each firing the
store, in one atomic step for the whole batch:

- takes the schedule if its stored revision is still ``expected_revision`` and no other
  firer is firing it at the same moment (else the firing is *lost*: nothing of it is done;
  another firer did or does it, or an operator changed the schedule);
- enqueues each tick dispatch whose id is not stored yet, as ``enqueue`` would (a tick
  whose thread belongs to another tenant is *refused* and passed over);
- stores the schedule (revision one more, ``updated_at`` now).

The dispatch ids are the ticks (``sched:{name}:{tick}``), so a batch repeated after a crash
creates nothing twice. PostgreSQL does a batch in one statement, SQLite in one write
transaction; ``wakeful.fleet.firing_batch`` fires through any other store one call at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

import msgspec

from wakeful.errors import InvalidInput
from wakeful.ids import check_id
from wakeful.records import Dispatch, Schedule
from wakeful.store import schedule_rows
from wakeful.store.validate_queue import check_dispatch

MAX_FIRINGS = 10_000
"""The most firings one batch may hold (and the most ticks)."""


class Firing(msgspec.Struct, frozen=True, kw_only=True):
    """One schedule's step in a batch: store ``schedule`` if the stored one still has
    ``expected_revision``, with ``dispatches`` (its ticks' ``start`` dispatches) enqueued."""

    schedule: Schedule
    expected_revision: int
    dispatches: tuple[Dispatch, ...] = ()


class Fired(msgspec.Struct, frozen=True, kw_only=True):
    """What a batch did: the dispatches it created (a tick stored before is not among
    them), the ids of the ticks refused for their tenant, and the names of the schedules it
    did not take (revision changed, or another firer was firing them)."""

    created: list[Dispatch] = msgspec.field(default_factory=list)
    refused: list[str] = msgspec.field(default_factory=list)
    lost: list[str] = msgspec.field(default_factory=list)


@runtime_checkable
class TickStore(Protocol):
    """A store that fires a batch of schedules in one step and reads what firing needs in
    one round trip each (PostgreSQL and SQLite)."""

    async def fire_schedules(self, firings: Sequence[Firing]) -> Fired:
        """Apply ``firings`` as the module says, in one atomic step."""
        ...

    async def unfinished_runs(self, dispatch_ids: Sequence[str]) -> set[str]:
        """Those of ``dispatch_ids`` whose run has not ended: the dispatch is not ``done``,
        or its run is its thread's latest checkpoint's and that is not terminal (what
        ``wakeful.fleet.schedules.previous_unfinished`` decides for one)."""
        ...

    async def next_schedule_due(self) -> tuple[datetime, datetime | None]:
        """The store's clock now and the earliest ``next_fire_at`` of a schedule not paused
        (``None``: none), in one read: how long a firer may wait."""
        ...


def check_firings(firings: object) -> list[Firing]:
    """Checked copies of ``firings`` (``InvalidInput`` otherwise): each schedule checked as
    ``put_schedule`` checks it, each dispatch as ``enqueue`` does and a ``start``, no
    schedule twice."""
    if not isinstance(firings, Sequence) or isinstance(firings, str | bytes):
        raise InvalidInput("firings", "must be a list of Firing")
    if len(firings) > MAX_FIRINGS:
        raise InvalidInput("firings", f"at most {MAX_FIRINGS} in one batch")
    checked: list[Firing] = []
    names: set[str] = set()
    ticks = 0
    for f in firings:
        if not isinstance(f, Firing):
            raise InvalidInput("firings", f"must hold Firing, got {type(f).__name__}")
        schedule = schedule_rows.check_schedule(f.schedule)
        expected = schedule_rows.check_expected(f.expected_revision)
        if expected is None or expected < 1:
            raise InvalidInput("expected_revision", "a firing replaces a stored schedule: >= 1")
        if schedule.name in names:
            raise InvalidInput("firings", f"schedule {schedule.name!r} is in the batch twice")
        names.add(schedule.name)
        dispatches = tuple(check_dispatch(d) for d in f.dispatches)
        for d in dispatches:
            if d.kind != "start" or d.dedupe_key is not None or d.if_busy != "enqueue":
                raise InvalidInput("firings", "a tick is a start without dedupe_key or if_busy")
        ticks += len(dispatches)
        checked.append(Firing(schedule=schedule, expected_revision=expected, dispatches=dispatches))
    if ticks > MAX_FIRINGS:
        raise InvalidInput("firings", f"at most {MAX_FIRINGS} ticks in one batch")
    return checked


def check_dispatch_ids(dispatch_ids: object) -> list[str]:
    if not isinstance(dispatch_ids, Sequence) or isinstance(dispatch_ids, str | bytes):
        raise InvalidInput("dispatch_ids", "must be a list of dispatch ids")
    if len(dispatch_ids) > MAX_FIRINGS:
        raise InvalidInput("dispatch_ids", f"at most {MAX_FIRINGS} at once")
    return [check_id("dispatch_id", d) for d in dispatch_ids]


__all__ = ["MAX_FIRINGS", "Fired", "Firing", "TickStore", "check_dispatch_ids", "check_firings"]
