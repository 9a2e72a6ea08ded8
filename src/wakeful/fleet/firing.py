"""Every worker fires due schedule ticks (``wakeful.fleet.schedules.fire_due``) in a
background task of its own, every ``interval`` seconds. There is no leader: a tick's
dispatch id is fixed, so two workers firing the same tick store one dispatch, and the
schedule advances by compare-and-set."""

from __future__ import annotations

import logging

from wakeful.background import BackgroundTask, StopSignal
from wakeful.errors import WakefulError
from wakeful.fleet.schedules import SchedulingStore, fire_due
from wakeful.fleet.wake import Wake

log = logging.getLogger("wakeful.schedules")


def firing_task(store: SchedulingStore, wake: Wake, interval: float) -> BackgroundTask:
    """The background task that fires ``store``'s due ticks every ``interval`` seconds,
    waking the fleet (``wake``) when it fired some."""

    async def body(signal: StopSignal) -> None:
        while not signal.is_set():
            try:
                fired = await fire_due(store, wake=wake)
                if fired:
                    log.info("fired %d schedule tick(s)", len(fired))
            except WakefulError as exc:
                log.warning("firing due schedules failed: %s", exc)
            if await signal.pause(interval):
                return

    return BackgroundTask("schedules", body, logger=log)


__all__ = ["firing_task"]
