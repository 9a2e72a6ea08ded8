"""Every worker fires due schedule ticks (``wakeful.fleet.schedules.fire_page``) in a
background task of its own. There is no leader: a tick's dispatch id is fixed, so two workers
firing the same tick store one dispatch, and the schedule advances by compare-and-set.

The task reads a page of due schedules; a full page it took means more may be due now, so
it reads again at once (10,000 schedules due at 09:00 are fired back to back, in batches).
Otherwise, on a store that keeps ticks prepared ahead (PostgreSQL, decision 0055), it
prepares the schedules due within ``AHEAD`` seconds, so that when they are due the store
fires them set-based; then it waits until the next schedule is due by the store's clock, at
most ``interval`` seconds: on a store that says when that is
(``TickStore.next_schedule_due``), a tick is not late by up to a poll interval."""

from __future__ import annotations

import logging
import uuid

from wakeful.background import BackgroundTask, StopSignal
from wakeful.errors import WakefulError
from wakeful.fleet.firing_ahead import AHEAD, prepare_ahead
from wakeful.fleet.schedules import SchedulingStore, fire_page
from wakeful.fleet.wake import Wake
from wakeful.store.firings import AheadStore, TickStore

log = logging.getLogger("wakeful.schedules")

PAGE = 1000
"""Due schedules one firing step reads (fired in batches of ``firing_batch.BATCH``)."""
RECHECK = 0.05
"""Seconds before a firer looks again at schedules due that another firer was firing."""


async def next_pause(store: SchedulingStore, interval: float) -> float:
    """Seconds to wait before the next firing step: until the next due schedule by the
    store's clock, at most ``interval``; ``RECHECK`` while some are due (another firer has
    them in hand: they are fired, or due again if that firer died)."""
    if not isinstance(store, TickStore):
        return interval
    now, due = await store.next_schedule_due()
    if due is None:
        return interval
    wait = (due - now).total_seconds()
    return min(interval, RECHECK if wait <= 0 else wait)


def firing_task(
    store: SchedulingStore,
    wake: Wake,
    interval: float,
    *,
    page: int = PAGE,
    ahead: float = AHEAD,
) -> BackgroundTask:
    """The background task that fires ``store``'s due ticks (``page`` schedules a read),
    at least every ``interval`` seconds, waking the fleet (``wake``) when it fired some.
    On a store that keeps ticks prepared ahead (``AheadStore``), it prepares the schedules
    due within ``ahead`` seconds whenever nothing is due (decision 0055)."""

    salt = uuid.uuid4().hex  # this firer's order among schedules due at once

    async def body(signal: StopSignal) -> None:
        while not signal.is_set():
            pause = interval
            try:
                fired = await fire_page(store, limit=page, wake=wake, collect=False)
                if fired.fired:
                    log.info("fired %d schedule tick(s)", fired.fired)
                if fired.due == page and fired.taken > 0:
                    continue  # a full page: more may be due now
                if isinstance(store, AheadStore):
                    # nothing due now: prepare what is due soon (decision 0055)
                    stored = await prepare_ahead(store, ahead=ahead, limit=page, salt=salt)
                    if stored >= page:
                        continue  # more to prepare, once what is due now is fired
                pause = await next_pause(store, interval)
            except WakefulError as exc:
                log.warning("firing due schedules failed: %s", exc)
            if await signal.pause(pause):
                return

    return BackgroundTask("schedules", body, logger=log)


__all__ = ["PAGE", "firing_task", "next_pause"]
