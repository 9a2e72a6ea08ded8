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
from wakeful.ids import check_aware, check_id, check_optional_id
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


class Prepared(msgspec.Struct, frozen=True, kw_only=True):
    """A schedule's next tick computed ahead (decision 0055), for the store to fire alone when
    it is due (``AheadStore.fire_prepared``), valid while the stored schedule has
    ``revision``. ``tick`` ``None``: nothing to fire alone at that revision (the firer in
    Python fires it). Otherwise firing it at a moment in [``tick``, ``until``) does
    ``firing``: its schedule (as stored once the tick fired: ``next_fire_at`` the tick
    after) and its dispatch (none when the thread template refused the tick); unless the run
    of ``previous`` (the last tick's dispatch; ``None`` with ``overlap="allow"``) is
    unfinished: then with ``overlap="skip"`` the schedule only advances to the next tick,
    with ``"enqueue"`` it is stored ``waiting`` and looked at again a second later (by the
    firer in Python, as ``firing_batch.plan`` makes a tick wait)."""

    name: str
    revision: int
    tick: datetime | None = None
    until: datetime | None = None
    firing: Firing | None = None
    previous: str | None = None
    waiting: Schedule | None = None
    """With ``overlap="enqueue"``: the schedule as stored while the tick waits for the
    previous run (``waiting_since`` the tick)."""


class FiredAhead(msgspec.Struct, frozen=True, kw_only=True):
    """What one ``fire_prepared`` call did: the schedules it advanced (``taken``: fired,
    passed over for overlap, or made to wait), those of them made to wait (``waiting``), how
    many
    dispatches it created (``fired``) and which (``created``, when collected), and the
    ticks it refused for their tenant."""

    taken: int = 0
    waiting: int = 0
    fired: int = 0
    created: list[Dispatch] = msgspec.field(default_factory=list)
    refused: list[str] = msgspec.field(default_factory=list)


@runtime_checkable
class AheadStore(Protocol):
    """A store that keeps schedule ticks prepared ahead and fires the due ones set-based, in
    a few statements per batch whatever its size (PostgreSQL, decision 0055)."""

    async def to_prepare(
        self, ahead: float, limit: int, salt: str = ""
    ) -> tuple[datetime, list[Schedule]]:
        """The store's clock and up to ``limit`` schedules not paused, due within ``ahead``
        seconds, that have no preparation at their revision (earliest first; among those due
        at once, in an order that ``salt`` shuffles, so two firers start apart)."""
        ...

    async def prepare_ticks(self, prepared: Sequence[Prepared]) -> int:
        """Store ``prepared`` with their schedules, each only if the schedule still has its
        ``revision`` and no one is firing it now; how many were stored."""
        ...

    async def due_unprepared(self, limit: int = 100) -> tuple[datetime, list[Schedule]]:
        """``ScheduleStore.due_schedules`` without the schedules ``fire_prepared`` would fire
        now: what the firer in Python has left to fire."""
        ...

    async def fire_prepared(self, limit: int, *, collect: bool = True) -> FiredAhead:
        """Fire up to ``limit`` due schedules whose preparation is valid now, in one atomic
        step, splitting them with concurrent callers (rows another caller holds are passed
        over), as ``Prepared`` says; the dispatches created are returned if ``collect`` (the
        firing loop only counts them)."""
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


def check_prepared(prepared: object) -> list[Prepared]:
    """Checked copies of ``prepared`` (``InvalidInput`` otherwise)."""
    if not isinstance(prepared, Sequence) or isinstance(prepared, str | bytes):
        raise InvalidInput("prepared", "must be a list of Prepared")
    if len(prepared) > MAX_FIRINGS:
        raise InvalidInput("prepared", f"at most {MAX_FIRINGS} at once")
    checked: list[Prepared] = []
    for p in prepared:
        if not isinstance(p, Prepared):
            raise InvalidInput("prepared", f"must hold Prepared, got {type(p).__name__}")
        check_id("name", p.name)
        check_optional_id("previous", p.previous)
        if p.tick is None:
            checked.append(Prepared(name=p.name, revision=p.revision))
            continue
        if p.firing is None or p.firing.schedule.name != p.name or len(p.firing.dispatches) > 1:
            raise InvalidInput("prepared", "a prepared tick holds its schedule's firing")
        (firing,) = check_firings([p.firing])
        waiting = None
        if p.waiting is not None:
            waiting = schedule_rows.check_schedule(p.waiting)
            if waiting.name != p.name:
                raise InvalidInput("prepared", "a prepared tick waits as its own schedule")
        tick = check_aware("tick", p.tick)
        checked.append(msgspec.structs.replace(p, firing=firing, waiting=waiting, tick=tick))
    return checked


__all__ = [
    "MAX_FIRINGS",
    "AheadStore",
    "Fired",
    "FiredAhead",
    "Firing",
    "Prepared",
    "TickStore",
    "check_dispatch_ids",
    "check_firings",
    "check_prepared",
]
