"""Schedule ticks prepared ahead (decision 0055): what makes firing 10,000 schedules due at
the same instant a few set-based statements on PostgreSQL, with no per-tick work in Python.

The server cannot compute a cron schedule's next tick (cron and time zones are Python's,
decision 0038). So a firer computes, before a schedule is due (up to ``AHEAD`` seconds
before), what firing its next tick does (``prepare``: ``plan`` applied at the tick, as if
the previous run had ended) and stores it with the schedule (``AheadStore.prepare_ticks``),
valid only at the schedule's current revision. When the tick is due, any firer's
``fire_prepared`` fires every due schedule with a valid preparation in batches, set-based,
deciding the one thing left (whether the previous tick's run is unfinished) there: a busy
schedule is passed over (``overlap="skip"``) or made to wait (``"enqueue"``) as ``plan``
would.

A preparation holds for a firing moment in [tick, until): ``until`` is the next tick (a
firer later than that catches several ticks up: the firer in Python does it), or 60 s after
the tick with ``catch_up="skip"`` (the tick counts as missed). Anything else (a schedule
whose tick waits already, a paused one, one changed since it was prepared, one prepared too
late) is fired as before, in Python (``wakeful.fleet.firing_batch``), which reads only those
(``AheadStore.due_unprepared``); the dispatch id of a tick is the same either way, so
nothing fires twice."""

from __future__ import annotations

import logging
from datetime import timedelta

from wakeful.errors import WakefulError
from wakeful.fleet.firing_batch import SKIP_GRACE, plan
from wakeful.fleet.ticks import next_tick
from wakeful.records import Schedule
from wakeful.store.firings import AheadStore, Prepared, check_prepared

log = logging.getLogger("wakeful.schedules")

AHEAD = 60.0
"""Seconds before its tick a schedule is prepared."""
PAGE = 1000
"""Schedules one preparing step reads."""
_US = timedelta(microseconds=1)


def prepare(s: Schedule) -> Prepared:
    """What firing ``s``'s next tick does, computed now: ``plan`` at the tick, the previous
    run taken as ended (the store checks it when it fires). Nothing to fire alone (``tick``
    ``None``) when ``s`` is paused, has no tick, waits (``waiting_since``) or cannot be
    planned."""
    nothing = Prepared(name=s.name, revision=s.revision)
    tick = s.next_fire_at
    if s.paused or tick is None or s.waiting_since is not None:
        return nothing
    try:
        after = next_tick(s, tick)
        firing = plan(s, tick, False, after)
    except WakefulError:
        return nothing
    if firing.schedule.last_tick != tick:  # next_fire_at is not one of its ticks
        return nothing
    until = after
    if s.catch_up == "skip":
        grace = tick + SKIP_GRACE + _US  # plan fires it while now - tick <= SKIP_GRACE
        until = grace if until is None else min(until, grace)
    previous = s.last_dispatch_id if s.overlap != "allow" else None
    # the store makes it wait, when the previous run is unfinished, as plan does
    waiting = plan(s, tick, True, after).schedule if s.overlap == "enqueue" else None
    prepared = Prepared(
        name=s.name,
        revision=s.revision,
        tick=tick,
        until=until,
        firing=firing,
        previous=previous,
        waiting=waiting,
    )
    try:
        check_prepared([prepared])
    except WakefulError as exc:  # fired in Python when due, which says why it fails
        log.debug("schedule %s not prepared: %s", s.name, exc)
        return nothing
    return prepared


async def prepare_ahead(
    store: AheadStore, *, ahead: float = AHEAD, limit: int = PAGE, salt: str = ""
) -> int:
    """Prepare up to ``limit`` schedules due within ``ahead`` seconds that have no valid
    preparation; how many were stored (another firer may hold or have changed the others).
    ``salt`` orders those due at once differently per firer, so two firers mostly prepare
    different schedules."""
    _now, schedules = await store.to_prepare(ahead, limit, salt)
    if not schedules:
        return 0
    return await store.prepare_ticks([prepare(s) for s in schedules])


__all__ = ["AHEAD", "PAGE", "prepare", "prepare_ahead"]
