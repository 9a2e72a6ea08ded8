"""Schedules: define them (``schedule``), operate them (pause, resume, delete, trigger) and
fire their due ticks (``fire_due``), exactly once per tick however many workers fire.

Firing needs no leader and holds no lock across a round trip (decision 0038): a firer reads
the due schedules, computes their ticks in Python (``wakeful.fleet.ticks``), enqueues each
tick's dispatch under the id ``sched:{name}:{tick in UTC}`` (a second enqueue of the same id
stores nothing more) and then advances ``next_fire_at`` by compare-and-set on the
schedule's revision. A firer that crashes between the two steps leaves the schedule due;
the next firer computes the same ticks and their ids, so nothing is fired twice. Due is
judged by the store's clock (``ScheduleStore.store_now``), never a worker's."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

import msgspec

from wakeful.errors import (
    DispatchConflict,
    InvalidInput,
    NotFound,
    ScheduleContended,
    TenantMismatch,
    WakefulError,
)
from wakeful.fleet.client import submit
from wakeful.fleet.ticks import check_cron, next_tick, tick_label, ticks_back, zone
from wakeful.fleet.wake import Wake
from wakeful.ids import check_id
from wakeful.records import TERMINAL_STATUSES, Dispatch, Schedule
from wakeful.store.contract import DispatchQueue, ScheduleStore, ThreadStore
from wakeful.store.schedule_rows import CATCH_UPS, OVERLAPS, check_schedule

log = logging.getLogger("wakeful.schedules")

SKIP_GRACE = timedelta(seconds=60)
"""With ``catch_up="skip"``, a tick fired more than this late counts as missed."""
ENQUEUE_RECHECK = timedelta(seconds=1)
"""How soon a schedule whose tick waits (``overlap="enqueue"``) is looked at again."""
FIRING_CONCURRENCY = 8
"""Schedules one ``fire_due`` call fires at a time (each a few round trips)."""
CAS_TRIES = 8
"""How often an operator action re-reads a schedule whose revision changed under it."""

Overlap = Literal["skip", "enqueue", "allow"]
CatchUp = Literal["skip", "latest", "all"]


class SchedulingStore(ScheduleStore, DispatchQueue, ThreadStore, Protocol):
    """What scheduling needs of a store (every store of ``open_store`` is one)."""


def schedule_dispatch_id(name: str, tick: datetime) -> str:
    """The dispatch id of ``name``'s tick at ``tick``: the same for every firer."""
    return f"sched:{name}:{tick_label(tick)}"


def thread_for(s: Schedule, tick: datetime) -> str:
    """The thread a tick runs on: ``thread``, or ``thread_template`` filled with the tick's
    local ``{date}`` (2026-12-08), ``{time}`` (0900), ``{tick}`` (UTC, 20261208T090000Z)
    and ``{name}``."""
    if s.thread is not None:
        return s.thread
    assert s.thread_template is not None
    local = tick.astimezone(zone(s.timezone))
    values = {
        "date": local.strftime("%Y-%m-%d"),
        "time": local.strftime("%H%M%S") if local.second else local.strftime("%H%M"),
        "tick": tick_label(tick).replace("-", "").replace(":", ""),
        "name": s.name,
    }
    try:
        return check_id("thread_template", s.thread_template.format(**values))
    except (KeyError, IndexError, ValueError) as exc:
        raise InvalidInput(
            "thread_template",
            f"{s.thread_template!r} may name only {{date}}, {{time}}, {{tick}}, {{name}}: {exc}",
        ) from None


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


async def fire_due(
    store: SchedulingStore, *, limit: int = 100, wake: Wake | None = None
) -> list[Dispatch]:
    """Fire the due ticks of up to ``limit`` schedules (due by the store's clock) and return
    the dispatches this call created. Calling it again for the same moment, here or in any
    other process, creates nothing more: a tick's dispatch id is fixed."""
    now, due = await store.due_schedules(limit)
    # Several workers read the same due schedules: each takes them in its own order, so
    # they mostly fire different ones; a few at a time, so a burst (10k schedules at 09:00)
    # is not one round trip after another.
    random.shuffle(due)
    gate = asyncio.Semaphore(FIRING_CONCURRENCY)
    created: list[Dispatch] = []

    async def one(s: Schedule) -> None:
        async with gate:
            try:
                created.extend(await _fire(store, s, now, wake))
            except WakefulError as exc:  # one broken schedule must not stop the others
                log.warning("firing schedule %s failed: %s", s.name, exc)

    await asyncio.gather(*(one(s) for s in due))
    return created


async def _fire(
    store: SchedulingStore, s: Schedule, now: datetime, wake: Wake | None
) -> list[Dispatch]:
    assert s.next_fire_at is not None
    since = s.waiting_since or s.next_fire_at
    busy = s.overlap != "allow" and await previous_unfinished(store, s.last_dispatch_id)
    if busy and s.overlap == "enqueue":
        # the ticks wait for the previous run (catch_up decides once it ends); looked at
        # again in a moment, behind the schedules due before then, so that many waiting
        # schedules never keep the others from being read
        waiting = msgspec.structs.replace(
            s, waiting_since=since, next_fire_at=now + ENQUEUE_RECHECK
        )
        await store.put_schedule(waiting, s.revision)
        return []
    if s.catch_up == "all":
        ticks = ticks_back(s, now, since, s.max_catch_up)
    else:
        ticks = ticks_back(s, now, since, 1)
        if s.catch_up == "skip" and ticks and now - ticks[-1] > SKIP_GRACE:
            ticks = []
    if busy:  # overlap == "skip"
        ticks = []
    created: list[Dispatch] = []
    for tick in ticks:
        dispatch_id = schedule_dispatch_id(s.name, tick)
        if await store.get_dispatch(dispatch_id) is not None:
            continue  # another firer (or an earlier attempt of this one) fired it
        try:
            created.append(await _submit(store, s, tick, dispatch_id, wake))
        except (TenantMismatch, InvalidInput) as refused:
            # no retry can store it (the thread is another tenant's): the tick is lost,
            # said once, rather than refused again at every poll of every worker
            log.warning("schedule %s: tick %s refused: %s", s.name, dispatch_id, refused)
    advanced = msgspec.structs.replace(
        s,
        next_fire_at=next_tick(s, now),
        waiting_since=None,
        last_tick=ticks[-1] if ticks else s.last_tick,
        last_dispatch_id=schedule_dispatch_id(s.name, ticks[-1]) if ticks else s.last_dispatch_id,
        fired=s.fired + len(ticks),
    )
    # None: another firer advanced it (firing the same ticks), or an operator changed it
    await store.put_schedule(advanced, s.revision)
    return created


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


async def previous_unfinished(store: SchedulingStore, dispatch_id: str | None) -> bool:
    """Whether the run the dispatch ``dispatch_id`` started has not ended yet: its dispatch
    is still open, or its run is the thread's latest and still running, suspended or
    asleep (a resumed run's first dispatch is done while the run goes on)."""
    if dispatch_id is None:
        return False
    d = await store.get_dispatch(dispatch_id)
    if d is None:
        return False
    if d.status != "done":
        return True
    snap = await store.read(d.thread_id)
    latest = snap.checkpoint if snap is not None else None
    run_id = d.payload.get("run_id") if isinstance(d.payload, dict) else None
    return latest is not None and latest.run_id == run_id and latest.status not in TERMINAL_STATUSES


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
    "SKIP_GRACE",
    "SchedulingStore",
    "delete_schedule",
    "fire_due",
    "pause_schedule",
    "previous_unfinished",
    "resume_schedule",
    "schedule",
    "schedule_dispatch_id",
    "thread_for",
    "trigger_schedule",
]
