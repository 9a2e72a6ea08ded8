"""When a schedule ticks: cron expressions read in a time zone (``cronsim``, decision 0038)
or a fixed interval, as UTC instants.

Cron follows Debian cron through daylight-saving changes, as ``cronsim`` does: a time that
does not exist on a spring-forward day (02:30 in Europe/Paris on the last Sunday of March)
ticks once, at the first instant after the gap (03:00 local); a time that occurs twice on a
fall-back day ticks once, at its first occurrence. An expression of six fields starts with
seconds. An interval schedule (``every`` seconds) ticks at the multiples of ``every`` since
the Unix epoch, so every firer computes the same ticks whenever the schedule was made."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from wakeful.errors import InvalidInput
from wakeful.records import Schedule

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def check_cron(expression: str) -> str:
    """``expression`` if it is a cron expression of five or six fields, else ``InvalidInput``
    naming what is wrong."""
    if not isinstance(expression, str):
        raise InvalidInput("cron", f"must be a string, got {type(expression).__name__}")
    try:
        CronSim(expression, datetime(2026, 1, 1))
    except CronSimError as exc:
        raise InvalidInput("cron", f"{expression!r} is not a cron expression: {exc}") from None
    return expression


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` (``InvalidInput`` when unknown)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidInput("timezone", f"{name!r} is not a known IANA time zone") from None


def next_tick(schedule: Schedule, after: datetime) -> datetime | None:
    """The schedule's first tick strictly after ``after`` (UTC), or ``None`` if it has none
    (a cron date that never comes, such as February 30)."""
    if schedule.every is not None:
        step = _step(schedule.every)
        n = (after - EPOCH) // step
        return EPOCH + (n + 1) * step
    assert schedule.cron is not None
    local = after.astimezone(zone(schedule.timezone))
    try:
        return next(iter(CronSim(schedule.cron, local))).astimezone(UTC)
    except (StopIteration, CronSimError):
        return None


def ticks_back(schedule: Schedule, now: datetime, since: datetime, n: int) -> list[datetime]:
    """Up to ``n`` of the latest ticks ``t`` with ``since <= t <= now``, oldest first. Walks
    back from ``now``, so a long downtime costs ``n`` steps, not one per missed tick."""
    found: list[datetime] = []
    if n <= 0 or since > now:
        return found
    if schedule.every is not None:
        step = _step(schedule.every)
        t = EPOCH + ((now - EPOCH) // step) * step
        while t >= since and len(found) < n:
            found.append(t)
            t -= step
    else:
        assert schedule.cron is not None
        # reverse iteration yields ticks strictly before its start: start a microsecond on
        local = (now + _US).astimezone(zone(schedule.timezone))
        try:
            for tick in CronSim(schedule.cron, local, reverse=True):
                t = tick.astimezone(UTC)
                if t < since or len(found) >= n:
                    break
                found.append(t)
        except CronSimError:
            pass
    found.reverse()
    return found


def _step(every: float) -> timedelta:
    if not (math.isfinite(every) and every >= 0.001):
        raise InvalidInput("every", "must be a finite number of seconds, at least 0.001")
    return timedelta(microseconds=round(every * 1_000_000))


def tick_label(tick: datetime) -> str:
    """A tick in UTC as it appears in dispatch ids: ``2026-12-08T09:00:00Z`` (with
    microseconds only when it has some)."""
    t = tick.astimezone(UTC)
    base = t.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{t.microsecond:06d}Z" if t.microsecond else f"{base}Z"


__all__ = ["check_cron", "next_tick", "tick_label", "ticks_back", "zone"]
