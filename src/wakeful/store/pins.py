"""Pinned runs (issue 40, decision 0035 "Versions"): which dispatches a worker of a code
version may lease, what a lease pins, and which versions still have a live worker. Shared
by the stores that decide in Python (memory, file, SQLite); PostgreSQL does the same in SQL.

- A lease by a versioned worker pins an unpinned dispatch (other than a ``cancel``) to the
  worker's version: its retries and recoveries stay with that version's workers.
- A ``resume`` is enqueued pinned to the version of the run it continues (the dispatch that
  holds the thread's run slot, the suspended run's).
- A pinned dispatch is leased only by a worker of its version; an unpinned one by any worker
  that takes starts (``take_starts``: a draining worker takes none).
- ``release_pins`` unpins the pending (or lapsed) dispatches of a version none of whose
  workers has been alive for the pin grace, recording ``released_from``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from wakeful.records import Dispatch, WorkerInfo


def claimable_by(d: Dispatch, version: str | None, take_starts: bool) -> bool:
    """Whether a worker of ``version`` (``None``: one that names none) may lease ``d``."""
    if d.pinned_version is not None:
        return d.pinned_version == version
    return take_starts


def pin_on_lease(d: Dispatch, version: str | None) -> str | None:
    """The version a lease of ``d`` by a worker of ``version`` pins it to, if any."""
    if version is None or d.pinned_version is not None or d.kind == "cancel":
        return None
    return version


def pin_of_resume(holder: Dispatch | None) -> str | None:
    """The pin of a ``resume`` enqueued while ``holder`` holds its thread's run slot."""
    if holder is None or holder.kind == "cancel":
        return None
    return holder.pinned_version


def live_versions(workers: Iterable[WorkerInfo], now: datetime, pin_grace: float) -> set[str]:
    """The versions with a worker alive within the last ``pin_grace`` seconds: one whose last
    sign of life (its recorded stop, else its last heartbeat) is more recent than that."""
    since = now - timedelta(seconds=pin_grace)
    return {
        w.version
        for w in workers
        if w.version is not None and (w.stopped_at or w.last_heartbeat) > since
    }


__all__ = ["claimable_by", "live_versions", "pin_of_resume", "pin_on_lease"]
