"""Clocks. Stores that judge time by a clock take one; tests use ``ManualClock``."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of timezone-aware UTC time with microsecond precision."""

    def now(self) -> datetime: ...


class SystemClock:
    """The machine's wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)


class ManualClock:
    """A clock that moves only when told. Safe to share across tasks and OS threads."""

    def __init__(self, start: datetime = DEFAULT_START) -> None:
        self._now = _require_aware(start)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds`` (microsecond resolution); returns the new time."""
        if seconds < 0:
            raise ValueError("a ManualClock only moves forward; use set() to jump")
        with self._lock:
            self._now = self._now + timedelta(seconds=seconds)
            return self._now

    def set(self, dt: datetime) -> None:
        """Jump to ``dt`` (which may be earlier, to simulate a clock step back)."""
        with self._lock:
            self._now = _require_aware(dt)


def _require_aware(dt: datetime) -> datetime:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError("clock times must be timezone-aware")
    return dt.astimezone(UTC)
