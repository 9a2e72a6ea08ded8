"""Firing a page of due schedules in batches (decision 0044): what ``fire_due`` does with the
schedules it read.

Each due schedule becomes a ``Firing`` (``plan``): the ticks to fire (catch-up and overlap
decided here, in Python, from the schedule and whether its previous run is unfinished) as
``start`` dispatches, and the schedule advanced past them. A store that is a ``TickStore``
(PostgreSQL, SQLite) applies a whole batch in one step: one statement on PostgreSQL, so
10,000 schedules due at 09:00 cost a few dozen round trips, not 30,000. Any other store
(memory, file: in-process, where a call costs no round trip) gets the same result one call
at a time: each tick enqueued unless stored before, then the schedule advanced by
compare-and-set. Either way a tick's dispatch id is fixed, so nothing fires twice."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

import msgspec

from wakeful.errors import DispatchConflict, InvalidInput, TenantMismatch, WakefulError
from wakeful.fleet.ticks import tick_label, ticks_back, zone
from wakeful.ids import check_id
from wakeful.records import TERMINAL_STATUSES, Dispatch, Schedule
from wakeful.store.contract import DispatchQueue, ScheduleStore, ThreadStore
from wakeful.store.firings import Fired, Firing, TickStore

log = logging.getLogger("wakeful.schedules")

SKIP_GRACE = timedelta(seconds=60)
"""With ``catch_up="skip"``, a tick fired more than this late counts as missed."""
ENQUEUE_RECHECK = timedelta(seconds=1)
"""How soon a schedule whose tick waits (``overlap="enqueue"``) is looked at again."""
BATCH = 100
"""Schedules per batch: one statement each on PostgreSQL. Firers that read the same due
page take its batches in different orders and skip what another is firing."""
ONE_BY_ONE_CONCURRENCY = 8
"""Schedules fired at a time through a store that cannot take batches."""


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


def tick_dispatch(s: Schedule, thread_id: str, dispatch_id: str) -> Dispatch:
    """The ``start`` dispatch a tick (or a trigger) of ``s`` submits, as ``submit`` builds it."""
    payload = {
        "target": s.target,
        "input": s.input,
        "run_id": f"run-{dispatch_id}",
        "tenant": s.tenant,
    }
    return Dispatch(
        dispatch_id=check_id("dispatch_id", dispatch_id),
        thread_id=thread_id,
        kind="start",
        payload=payload,
        tenant=s.tenant,
    )


def plan(s: Schedule, now: datetime, busy: bool, next_tick: datetime | None) -> Firing:
    """What firing ``s`` at ``now`` does, ``busy`` telling whether its previous tick's run
    is unfinished and ``next_tick`` its first tick after ``now``."""
    assert s.next_fire_at is not None
    since = s.waiting_since or s.next_fire_at
    if busy and s.overlap == "enqueue":
        # the ticks wait for the previous run (catch_up decides once it ends); looked at
        # again in a moment, behind the schedules due before then, so that many waiting
        # schedules never keep the others from being read
        waiting = msgspec.structs.replace(
            s, waiting_since=since, next_fire_at=now + ENQUEUE_RECHECK
        )
        return Firing(schedule=waiting, expected_revision=s.revision)
    if s.catch_up == "all":
        ticks = ticks_back(s, now, since, s.max_catch_up)
    else:
        ticks = ticks_back(s, now, since, 1)
        if s.catch_up == "skip" and ticks and now - ticks[-1] > SKIP_GRACE:
            ticks = []
    if busy:  # overlap == "skip"
        ticks = []
    dispatches = []
    for tick in ticks:
        dispatch_id = schedule_dispatch_id(s.name, tick)
        try:
            dispatches.append(tick_dispatch(s, thread_for(s, tick), dispatch_id))
        except InvalidInput as refused:  # passed over, as a tick its tenant refuses
            log.warning("schedule %s: tick %s refused: %s", s.name, dispatch_id, refused)
    advanced = msgspec.structs.replace(
        s,
        next_fire_at=next_tick,
        waiting_since=None,
        last_tick=ticks[-1] if ticks else s.last_tick,
        last_dispatch_id=schedule_dispatch_id(s.name, ticks[-1]) if ticks else s.last_dispatch_id,
        fired=s.fired + len(ticks),
    )
    return Firing(schedule=advanced, expected_revision=s.revision, dispatches=tuple(dispatches))


async def unfinished(store: SchedulingStore, dispatch_ids: Sequence[str]) -> set[str]:
    """Those of ``dispatch_ids`` whose run has not ended (one read on a ``TickStore``)."""
    if not dispatch_ids:
        return set()
    if isinstance(store, TickStore):
        return await store.unfinished_runs(dispatch_ids)
    gate = asyncio.Semaphore(ONE_BY_ONE_CONCURRENCY)

    async def one(dispatch_id: str) -> str | None:
        async with gate:
            return dispatch_id if await previous_unfinished(store, dispatch_id) else None

    found = await asyncio.gather(*(one(d) for d in dispatch_ids))
    return {d for d in found if d is not None}


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


async def fire_batch(store: SchedulingStore, firings: Sequence[Firing]) -> Fired:
    """Apply ``firings``: in one step on a ``TickStore``, else one call at a time. Ticks are
    enqueued in thread order, so two firers take thread locks in one order."""
    if not firings:
        return Fired()
    if isinstance(store, TickStore):
        ordered = [
            msgspec.structs.replace(
                f, dispatches=tuple(sorted(f.dispatches, key=lambda d: d.thread_id))
            )
            for f in sorted(firings, key=_first_thread)
        ]
        fired = await store.fire_schedules(ordered)
    else:
        fired = Fired()
        gate = asyncio.Semaphore(ONE_BY_ONE_CONCURRENCY)

        async def one(f: Firing) -> None:
            async with gate:
                try:
                    await _fire_one(store, f, fired)
                except WakefulError as exc:  # one broken schedule must not stop the others
                    log.warning("firing schedule %s failed: %s", f.schedule.name, exc)

        # Such a store serves one process (memory, file): firers in it take turns, so a
        # tick two of them fire at once is reported created by the one that stored it.
        async with _turn(store):
            await asyncio.gather(*(one(f) for f in firings))
    for dispatch_id in fired.refused:
        log.warning("schedule tick %s refused: its thread is another tenant's", dispatch_id)
    return fired


_TURNS: weakref.WeakKeyDictionary[object, asyncio.Lock] = weakref.WeakKeyDictionary()


def _turn(store: object) -> asyncio.Lock:
    try:
        return _TURNS.setdefault(store, asyncio.Lock())
    except TypeError:  # not weakly referable: no turns (firing stays exactly once)
        return asyncio.Lock()


def _first_thread(f: Firing) -> str:
    return min((d.thread_id for d in f.dispatches), default="")


async def _fire_one(store: SchedulingStore, f: Firing, fired: Fired) -> None:
    """One firing through the plain store calls: the ticks first (each a fixed id), then the
    compare-and-set; a firer that dies between them leaves the schedule due and the next
    one's enqueues of the same ids store nothing."""
    current = await store.get_schedule(f.schedule.name)
    if current is None or current.revision != f.expected_revision:
        fired.lost.append(f.schedule.name)
        return
    for d in f.dispatches:
        if await store.get_dispatch(d.dispatch_id) is not None:
            continue  # another firer (or an earlier attempt of this one) fired it
        try:
            fired.created.append(await store.enqueue(d))
        except DispatchConflict:
            pass  # fired before the schedule's definition changed: it stays as fired
        except (TenantMismatch, InvalidInput):
            # no retry can store it (the thread is another tenant's): the tick is lost,
            # said once, rather than refused again at every poll of every worker
            fired.refused.append(d.dispatch_id)
    if await store.put_schedule(f.schedule, f.expected_revision) is None:
        # another firer advanced it (firing the same ticks), or an operator changed it
        fired.lost.append(f.schedule.name)


__all__ = [
    "BATCH",
    "ENQUEUE_RECHECK",
    "SKIP_GRACE",
    "SchedulingStore",
    "fire_batch",
    "plan",
    "previous_unfinished",
    "schedule_dispatch_id",
    "thread_for",
    "tick_dispatch",
    "unfinished",
]
