"""Counting the fleet for operators: queue depth by status, worker liveness, leases held."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from wakeful.records import DispatchStatus, WorkerInfo
from wakeful.store.contract import DispatchQueue

QUEUE_STATUSES: tuple[DispatchStatus, ...] = (
    "scheduled",
    "queued",
    "pending",
    "leased",
    "awaiting",
    "done",
    "quarantined",
)
PAGE = 500
DEFAULT_STALE_AFTER = 60.0
"""Seconds without a heartbeat after which a worker counts as expired (a worker beats every
third of its lease ttl, 10 s by default)."""

Liveness = Literal["alive", "expired", "stopped"]


async def count_dispatches(
    queue: DispatchQueue, status: DispatchStatus, bound: int = 10_000
) -> tuple[int, bool]:
    """How many dispatches have ``status``, counted by pages up to ``bound``; and whether the
    bound was reached (the true count may be larger)."""
    count, after = 0, None
    while count < bound:
        want = min(PAGE, bound - count)
        rows = await queue.list_dispatches(status=status, after=after, limit=want)
        count += len(rows)
        if len(rows) < want:
            return count, False
        after = rows[-1].dispatch_id
    return count, True


async def queue_depth(queue: DispatchQueue, bound: int = 10_000) -> dict[str, int]:
    """Dispatches per status, each counted up to ``bound``: the open statuses by the store's
    ``queue_depths`` (one index range each), ``done`` by pages."""
    open_counts = await queue.queue_depths(limit=bound)
    done, _ = await count_dispatches(queue, "done", bound)
    return {status: done if status == "done" else open_counts[status] for status in QUEUE_STATUSES}


def liveness(
    worker: WorkerInfo, now: datetime, stale_after: float = DEFAULT_STALE_AFTER
) -> Liveness:
    """``stopped`` once the incarnation recorded its graceful stop; else ``alive`` while its
    last heartbeat is at most ``stale_after`` seconds old, ``expired`` after (killed, or
    cut off from the store)."""
    if worker.stopped_at is not None:
        return "stopped"
    age = (now - worker.last_heartbeat).total_seconds()
    return "alive" if age <= stale_after else "expired"


__all__ = [
    "DEFAULT_STALE_AFTER",
    "QUEUE_STATUSES",
    "count_dispatches",
    "liveness",
    "queue_depth",
]


PINNED_STATUSES: tuple[DispatchStatus, ...] = ("pending", "leased", "awaiting", "quarantined")


async def pinned_runs(queue: DispatchQueue, bound: int = 10_000) -> tuple[dict[str, int], bool]:
    """Per code version, its open dispatches pinned to it (``PINNED_STATUSES``: a run's
    next step waits for, or runs on, that version's workers; issue 40), read by pages of
    each status up to ``bound`` rows in all; and whether the bound was reached."""
    counts: dict[str, int] = {}
    read = 0
    for status in PINNED_STATUSES:
        after: str | None = None
        while read < bound:
            want = min(PAGE, bound - read)
            rows = await queue.list_dispatches(status=status, after=after, limit=want)
            read += len(rows)
            for d in rows:
                if d.pinned_version is not None:
                    counts[d.pinned_version] = counts.get(d.pinned_version, 0) + 1
            if len(rows) < want:
                break
            after = rows[-1].dispatch_id
        if read >= bound:
            return counts, True
    return counts, False
