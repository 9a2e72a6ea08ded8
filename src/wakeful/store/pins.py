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
  workers has been alive for the pin grace, recording ``released_from``.
- ``migrate_runs`` (an operator's ``wakeful runs migrate``) re-pins the dispatches of one
  version's runs to another version, each with a ``run.migrated`` event on its thread in
  the same atomic step."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec

from wakeful.errors import InvalidInput, NotFound
from wakeful.ids import check_count, check_id
from wakeful.records import Dispatch, Event, EventDraft, WorkerInfo

if TYPE_CHECKING:
    from wakeful.store.mutations import PinsReleased
    from wakeful.store.projection import State

MIGRATED = "run.migrated"
MOVABLE = ("pending", "leased", "awaiting", "quarantined")
"""The statuses ``migrate_runs`` moves (``leased`` only once the lease lapsed)."""


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


def check_migration(from_version: str, to_version: str, limit: int) -> tuple[str, str, int]:
    """``migrate_runs``'s arguments, checked: two different versions, a batch of 1-1000."""
    check_id("from_version", from_version)
    check_id("to_version", to_version)
    if from_version == to_version:
        raise InvalidInput("to_version", f"the runs of {from_version} are already pinned to it")
    return from_version, to_version, check_count("limit", limit, minimum=1, maximum=1000)


def check_running(workers: Iterable[WorkerInfo], version: str) -> None:
    """``NotFound`` unless a registered worker of ``version`` has not recorded a stop: runs
    moved to a version no worker runs would wait for nothing (and be released at once)."""
    if not any(w.version == version and w.stopped_at is None for w in workers):
        raise NotFound("running worker of version", version)


def migrated_event(d: Dispatch, from_version: str, run_id: str | None) -> EventDraft:
    """The event a moved dispatch's thread gets (``d`` as moved, ``run_id`` its thread's
    latest run)."""
    data: dict[str, Any] = {
        "from": from_version,
        "to": d.pinned_version,
        "dispatch_id": d.dispatch_id,
        "run_id": run_id,
    }
    return EventDraft(type=MIGRATED, data=data, run_id=run_id)


def apply_pins(state: State, record: PinsReleased) -> None:
    """Apply ``record`` to the memory and file stores' projection: each dispatch unpinned
    (``released_from`` its pin) or re-pinned to ``to_version``, then the events appended."""
    to, at = record.to_version, record.at
    for did in record.dispatch_ids:
        d = state.dispatches[did]
        pin, released = (None, d.pinned_version) if to is None else (to, None)
        moved = msgspec.structs.replace(
            d, updated_at=at, pinned_version=pin, released_from=released
        )
        state._put_dispatch(moved)
    for tid, e in record.events:
        t = state.thread(tid)
        fields = msgspec.structs.asdict(e)
        t.events.append(Event(thread_id=tid, seq=t.next_seq, at=at, **fields))


__all__ = [
    "MIGRATED",
    "MOVABLE",
    "apply_pins",
    "check_migration",
    "check_running",
    "claimable_by",
    "live_versions",
    "migrated_event",
    "pin_of_resume",
    "pin_on_lease",
]
