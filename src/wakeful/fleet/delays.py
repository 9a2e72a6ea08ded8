"""Delayed submissions (``submit(after=..., at=...)``): when a dispatch becomes claimable,
as an instant of the store's clock.

``after`` is measured from the store's clock (``ScheduleStore.store_now``: PostgreSQL's
server clock, the injected clock elsewhere), never the submitter's; ``at`` is an instant
and must say its time zone. The dispatch is stored at once with ``available_at`` set, and
``claim_next`` leaves it alone until the store's clock reaches it."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from wakeful.errors import InvalidInput
from wakeful.ids import MAX_AGE_SECONDS
from wakeful.records import Dispatch

MAX_DELAY = timedelta(seconds=MAX_AGE_SECONDS)
"""The farthest ahead a dispatch may be delayed: a century (``ids.MAX_AGE_SECONDS``, what
every store's date types hold with room to spare)."""

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(w|d|h|m|s|ms))", re.IGNORECASE)
_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def delay_seconds(field: str, after: object) -> float:
    """``after`` (seconds, or a ``timedelta``) as seconds: finite, >= 0, at most
    ``MAX_DELAY``."""
    if isinstance(after, timedelta):
        seconds = after.total_seconds()
    elif isinstance(after, int | float) and not isinstance(after, bool):
        seconds = float(after)
    else:
        raise InvalidInput(field, f"must be seconds or a timedelta, got {type(after).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(field, "must be a finite delay of 0 seconds or more")
    if seconds > MAX_DELAY.total_seconds():
        raise InvalidInput(field, f"{seconds} s is beyond the limit of {MAX_DELAY.days} days")
    return seconds


def check_at(field: str, at: object) -> datetime:
    """``at`` in UTC, if it is a timezone-aware datetime that UTC can hold."""
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise InvalidInput(field, "must be a timezone-aware datetime (say its offset, or Z)")
    try:
        return at.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(field, f"{at.isoformat()} is out of range in UTC") from None


def parse_duration(text: str, field: str = "after") -> float:
    """``"10m"``, ``"1h30m"``, ``"2d"``, ``"500ms"``, ``"90"`` (seconds) as seconds."""
    raw = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        return delay_seconds(field, float(raw))
    pos, total = 0, 0.0
    for match in _DURATION.finditer(raw):
        if match.start() != pos:
            break
        total += float(match[1]) * _UNITS[match[2].lower()]
        pos = match.end()
    if pos != len(raw) or not raw:
        raise InvalidInput(field, f"{text!r} is not a duration such as 90, 10m, 1h30m or 2d")
    return delay_seconds(field, total)


def debounce_seconds(debounce: object) -> float:
    """A debounce window (seconds, or a ``timedelta``): more than 0, at most ``MAX_DELAY``."""
    seconds = delay_seconds("debounce", debounce)
    if seconds <= 0:
        raise InvalidInput("debounce", "must be more than 0 seconds")
    return seconds


def parse_instant(text: str) -> datetime:
    """An ISO 8601 instant with its offset (``2026-12-08T09:00Z``, ``...+01:00``)."""
    raw = text.strip()
    try:
        at = datetime.fromisoformat(raw[:-1] + "+00:00" if raw[-1:] in "zZ" else raw)
    except ValueError:
        raise InvalidInput("at", f"{text!r} is not an ISO 8601 date and time") from None
    return check_at("at", at)


def not_before(now: datetime, after: object = None, at: object = None) -> datetime | None:
    """The instant a dispatch becomes claimable given the store's ``now``: ``now + after``,
    ``at``, or ``None`` (at once). Refuses both, an ``at`` without a time zone, and either
    beyond ``MAX_DELAY``."""
    if after is not None and at is not None:
        raise InvalidInput("after", "give after or at, not both")
    if after is not None:
        return now + timedelta(seconds=delay_seconds("after", after))
    if at is not None:
        instant = check_at("at", at)
        if instant - now > MAX_DELAY:
            raise InvalidInput("at", f"is more than {MAX_DELAY.days} days ahead")
        return instant
    return None


def waits_until(d: Dispatch) -> datetime | None:
    """When work waits for a time (``scheduled``: a delayed run, a retry's backoff, a
    sleeping run's wake-up, a debounced submission): its ``available_at``; ``None`` for work
    claimable since it was stored or no longer waiting. (A ``pending`` dispatch with a later
    ``available_at`` is one stored before the ``scheduled`` status, in a file store's log.)"""
    at, created = d.available_at, d.created_at
    if d.status == "scheduled":
        return at
    if d.status != "pending" or at is None or created is None or at <= created:
        return None
    return at


__all__ = [
    "MAX_DELAY",
    "check_at",
    "delay_seconds",
    "not_before",
    "parse_duration",
    "parse_instant",
    "waits_until",
]
