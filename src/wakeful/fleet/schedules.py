"""Schedules: define them (``schedule``), operate them (pause, resume, delete, trigger) and
fire their due ticks (``fire_due``), exactly once per tick however many workers fire.

Firing needs no leader and holds no lock across a round trip (decisions 0038 and 0044): a
firer reads the due schedules, computes their ticks in Python (``wakeful.fleet.ticks``),
enqueues each tick's dispatch under the id ``sched:{name}:{tick in UTC}`` (a second enqueue
of the same id stores nothing more) and advances ``next_fire_at`` by compare-and-set on the
schedule's revision: for a batch of schedules in one statement on PostgreSQL and one
transaction on SQLite (``wakeful.fleet.firing_batch``). A firer that crashes before that
leaves the schedules due; the next firer computes the same ticks and their ids, so nothing
is fired twice. Due is judged by the store's clock (``ScheduleStore.store_now``), never a
worker's."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

import msgspec

from wakeful.errors import (
    DispatchConflict,
    InvalidInput,
    NotFound,
    ScheduleContended,
    WakefulError,
)
from wakeful.fleet.client import submit
from wakeful.fleet.firing_batch import (
    BATCH,
    ENQUEUE_RECHECK,
    SKIP_GRACE,
    SchedulingStore,
    fire_batch,
    plan,
    previous_unfinished,
    schedule_dispatch_id,
    thread_for,
    unfinished,
)
from wakeful.fleet.ticks import check_cron, next_tick, tick_label, zone
from wakeful.fleet.wake import Wake
from wakeful.records import Dispatch, Schedule
from wakeful.store.contract import ScheduleStore
from wakeful.store.firings import AheadStore, Firing
from wakeful.store.schedule_rows import CATCH_UPS, OVERLAPS, check_schedule

log = logging.getLogger("wakeful.schedules")

CAS_TRIES = 8
"""How often an operator action re-reads a schedule whose revision changed under it."""

Overlap = Literal["skip", "enqueue", "allow"]
CatchUp = Literal["skip", "latest", "all"]


async def schedule(
    store: ScheduleStore,
    name: str,
    cron: str | None = None,
    *,
    target: str,
    every: float | timedelta | None = None,
    input: Any = None,
    thread: str | None = None,
    thread_template: str | None = None,
    timezone: str = "UTC",
    overlap: Overlap = "skip",
    catch_up: CatchUp = "latest",
    max_catch_up: int = 10,
    tenant: str | None = None,
    paused: bool = False,
) -> Schedule:
    """Create or replace the schedule ``name``: a run of ``target`` with ``input`` at every
    tick of ``cron`` (read in ``timezone``; six fields start with seconds) or ``every``
    seconds, on ``thread`` or on the thread ``thread_template`` names per tick
    (``"digest-{date}"``). Its first tick is the first after now by the store's clock.
    Replacing keeps what was fired (``last_tick``, ``last_dispatch_id``, ``fired``).

    ``overlap``: what a tick does while the previous tick's run is unfinished: ``skip`` it,
    ``enqueue`` it (it waits, and fires once that run ends), or ``allow`` it (fire
    anyway). ``catch_up``: what ticks missed by more than a moment (downtime) do: ``skip``
    (only a tick at most ``SKIP_GRACE`` late fires), ``latest`` (the latest fires) or
    ``all`` (the latest ``max_catch_up`` fire, oldest first)."""
    if isinstance(every, timedelta):
        every = every.total_seconds()
    if cron is not None:
        check_cron(cron)
    zone(timezone)
    if overlap not in OVERLAPS:
        raise InvalidInput("overlap", f"must be one of {list(OVERLAPS)}")
    if catch_up not in CATCH_UPS:
        raise InvalidInput("catch_up", f"must be one of {list(CATCH_UPS)}")
    draft = check_schedule(
        Schedule(
            name=name,
            target=target,
            cron=cron,
            every=every,
            input=input,
            thread=thread,
            thread_template=thread_template,
            timezone=timezone,
            overlap=overlap,
            catch_up=catch_up,
            max_catch_up=max_catch_up,
            tenant=tenant,
            paused=paused,
        )
    )
    now = await store.store_now()
    thread_for(draft, now)  # a template that cannot name a thread is refused now
    draft = msgspec.structs.replace(draft, next_fire_at=next_tick(draft, now))
    for _ in range(CAS_TRIES):
        current = await store.get_schedule(name)
        new = draft
        if current is not None:
            new = msgspec.structs.replace(
                draft,
                last_tick=current.last_tick,
                last_dispatch_id=current.last_dispatch_id,
                fired=current.fired,
            )
        stored = await store.put_schedule(new, current.revision if current else 0)
        if stored is not None:
            return stored
    raise _contended(name)


async def pause_schedule(store: ScheduleStore, name: str) -> Schedule:
    """Stop firing ``name`` until ``resume_schedule``; ticks meanwhile are not caught up."""
    return await _change(store, name, lambda s, _now: {"paused": True})


async def resume_schedule(store: ScheduleStore, name: str) -> Schedule:
    """Fire ``name`` again from its first tick after now (the store's clock)."""
    return await _change(
        store,
        name,
        lambda s, now: {"paused": False, "next_fire_at": next_tick(s, now), "waiting_since": None},
    )


async def delete_schedule(store: ScheduleStore, name: str) -> bool:
    """Remove ``name``; whether it existed. What it fired stays."""
    return await store.delete_schedule(name)


async def trigger_schedule(
    store: SchedulingStore, name: str, *, wake: Wake | None = None
) -> Dispatch:
    """Fire ``name`` once now, outside its ticks (its overlap policy does not apply), as the
    dispatch ``sched:{name}:trigger:{now in UTC}``. Its ticks are unchanged."""
    s = await store.get_schedule(name)
    if s is None:
        raise NotFound("schedule", name)
    now = await store.store_now()
    dispatch_id = f"sched:{name}:trigger:{tick_label(now)}"
    dispatch = await _submit(store, s, now, dispatch_id, wake)
    await _change(
        store, name, lambda cur, _n: {"last_dispatch_id": dispatch_id, "fired": cur.fired + 1}
    )
    return dispatch


class FiredPage(NamedTuple):
    """What one ``fire_page`` call did: the dispatches it created (those the store fired
    set-based only when asked to ``collect`` them), how many schedules it read due, how many
    of those it fired or advanced (the rest another firer took), and how many dispatches it
    created in all."""

    created: list[Dispatch]
    due: int
    taken: int
    fired: int = 0


async def fire_due(
    store: SchedulingStore, *, limit: int = 100, wake: Wake | None = None
) -> list[Dispatch]:
    """Fire the due ticks of up to ``limit`` schedules (due by the store's clock) and return
    the dispatches this call created. Calling it again for the same moment, here or in any
    other process, creates nothing more: a tick's dispatch id is fixed."""
    return (await fire_page(store, limit=limit, wake=wake)).created


async def fire_page(
    store: SchedulingStore, *, limit: int = 100, wake: Wake | None = None, collect: bool = True
) -> FiredPage:
    """``fire_due``, saying also how much of the due page this call took: a page of
    ``limit`` read and taken means more may be due now (the firing loop reads again at
    once). On a store that keeps ticks prepared ahead (``AheadStore``, decision 0055), up
    to ``limit`` due schedules prepared ahead are fired first, set-based; the others (not
    prepared, waiting, catching up) are read and fired in batches of ``BATCH`` (one
    statement each on PostgreSQL, ``wakeful.fleet.firing_batch``), after one read of which
    previous runs are unfinished."""
    created: list[Dispatch] = []
    count = 0
    if isinstance(store, AheadStore):
        # the due schedules prepared ahead first: set-based, nothing per tick in Python
        ahead = await store.fire_prepared(limit, collect=collect)
        for dispatch_id in ahead.refused:
            log.warning("schedule tick %s refused: its thread is another tenant's", dispatch_id)
        created.extend(ahead.created)
        count = ahead.fired
        if ahead.taken >= limit:  # a full batch: more may be due (the loop fires again)
            if count and wake is not None:
                await wake.notify()
            return FiredPage(created, limit, ahead.taken, count)
        # the others: fire_prepared leaves none of its own for this path to plan in vain
        now, due = await store.due_unprepared(limit)
    else:
        now, due = await store.due_schedules(limit)
    if not due:
        if count and wake is not None:
            await wake.notify()
        return FiredPage(created, 0, 0, count)
    # Several workers read the same due page: each takes it in its own order, in batches,
    # and a batch passes over the schedules another firer is firing at that moment.
    random.shuffle(due)
    last = [s.last_dispatch_id for s in due if s.overlap != "allow" and s.last_dispatch_id]
    busy = await unfinished(store, last)
    firings: list[Firing] = []
    for s in due:
        try:
            previous = s.overlap != "allow" and s.last_dispatch_id in busy
            firings.append(plan(s, now, previous, next_tick(s, now)))
        except WakefulError as exc:  # one broken schedule must not stop the others
            log.warning("firing schedule %s failed: %s", s.name, exc)
    taken = 0
    for i in range(0, len(firings), BATCH):
        batch = firings[i : i + BATCH]
        try:
            fired = await fire_batch(store, batch)
        except WakefulError as exc:  # left due: the next poll (or another firer) fires it
            log.warning("firing %d schedules failed: %s", len(batch), exc)
            continue
        created.extend(fired.created)
        count += len(fired.created)
        taken += len(batch) - len(fired.lost)
    if count and wake is not None:
        await wake.notify()
    return FiredPage(created, len(due), taken, count)


async def _submit(
    store: SchedulingStore, s: Schedule, tick: datetime, dispatch_id: str, wake: Wake | None
) -> Dispatch:
    try:
        return await submit(
            store,
            thread_for(s, tick),
            s.target,
            s.input,
            dispatch_id=dispatch_id,
            tenant=s.tenant,
            wake=wake,
        )
    except DispatchConflict:
        # the tick was fired before the schedule's definition changed: it stays as fired
        found = await store.get_dispatch(dispatch_id)
        if found is None:
            raise
        return found


async def _change(store: ScheduleStore, name: str, changes: Any) -> Schedule:
    for _ in range(CAS_TRIES):
        current = await store.get_schedule(name)
        if current is None:
            raise NotFound("schedule", name)
        now = await store.store_now()
        fields: Mapping[str, Any] = changes(current, now)
        stored = await store.put_schedule(
            msgspec.structs.replace(current, **fields), current.revision
        )
        if stored is not None:
            return stored
    raise _contended(name)


def _contended(name: str) -> ScheduleContended:
    return ScheduleContended(name, CAS_TRIES)


__all__ = [
    "ENQUEUE_RECHECK",
    "SKIP_GRACE",
    "FiredPage",
    "SchedulingStore",
    "delete_schedule",
    "fire_due",
    "fire_page",
    "pause_schedule",
    "previous_unfinished",
    "resume_schedule",
    "schedule",
    "schedule_dispatch_id",
    "thread_for",
    "trigger_schedule",
]
