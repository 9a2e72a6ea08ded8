"""Which workers take new starts when a fleet runs several versions (issue 40: "a start
dispatch by any worker, the newest version first if the fleet has several"; decision 0035,
"Versions", the amendment "newest version first").

A version *arrived* when the earliest of its live workers registered; the **newest**
version is the one that arrived last. A worker takes new starts (and every other unpinned
dispatch: a released pin, a pre-feature dispatch) only while its version is the newest
among the versions with a live worker; otherwise it passes ``take_starts=False`` to
``claim_next`` and gets only the work pinned to its version (its runs' continuations)
until it stops. So during a rolling deploy the new version takes every new start while
the old one drains its pinned runs; an old version left alone takes starts again.

"Live": the worker recorded no stop and beat within twice its lease ttl (it beats every
third of it). Arrival rather than a comparison of names: a version name is any id and a
default version is a hash, which have no order. A consequence, on purpose: starting
workers of an older build again after a newer one (a rollback) makes the older build the
newest deploy, and it takes the starts."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from wakeful.background import StopSignal
from wakeful.errors import WakefulError
from wakeful.fleet.census import liveness
from wakeful.fleet.deploys import claim_options
from wakeful.records import WorkerInfo

if TYPE_CHECKING:
    from wakeful.fleet.worker import Worker

log = logging.getLogger("wakeful.fleet")


def arrivals(
    workers: Iterable[WorkerInfo], now: datetime, stale_after: float
) -> dict[str, datetime]:
    """Each version with a live worker, by when its earliest live worker registered."""
    arrived: dict[str, datetime] = {}
    for w in workers:
        if w.version is None or liveness(w, now, stale_after) != "alive":
            continue
        first = arrived.get(w.version)
        if first is None or w.registered_at < first:
            arrived[w.version] = w.registered_at
    return arrived


def newest_version(workers: Iterable[WorkerInfo], now: datetime, stale_after: float) -> str | None:
    """The version that arrived last among those with a live worker (ties: the greater
    name, so that every worker agrees), or ``None`` when no versioned worker is live."""
    arrived = arrivals(workers, now, stale_after)
    if not arrived:
        return None
    return max(arrived, key=lambda v: (arrived[v], v))


def takes_starts(
    version: str | None, workers: Iterable[WorkerInfo], now: datetime, stale_after: float
) -> bool:
    """Whether a worker of ``version`` takes new starts: it names no version, or no live
    version arrived after its own (its own not listed as live yet counts as newest)."""
    if version is None:
        return True
    arrived = arrivals(workers, now, stale_after)
    mine = arrived.get(version)
    if mine is None:
        return True
    return all((at, v) <= (mine, version) for v, at in arrived.items())


class StartGate:
    """A worker's view of ``takes_starts``, refreshed from the worker registry every third
    of the lease ttl (at most every 10 s), and at once when the worker starts. A worker
    serving one thread (``wakeful run``) always takes its thread's start. A failed read
    keeps the last answer."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.options: dict[str, Any] = claim_options(worker.version, worker.only_thread)
        """The keyword arguments of the worker's ``claim_next``, ``take_starts`` kept current."""
        self.options["take_starts"] = True
        self.stale_after = 2 * worker.claims.ttl
        self.interval = max(min(worker.claims.ttl / 3, 10.0), 0.05)

    @property
    def take(self) -> bool:
        return bool(self.options["take_starts"])

    async def refresh(self) -> bool:
        """Read the registry and the store's clock; the new answer."""
        store = self.worker.store
        workers = await store.list_workers()
        now = await store.store_now()
        take = takes_starts(self.worker.version, workers, now, self.stale_after)
        if take != self.take:
            newest = newest_version(workers, now, self.stale_after)
            log.info(
                "worker %s (version %s) %s new starts (newest live version: %s)",
                self.worker.worker_id,
                self.worker.version,
                "takes" if take else "leaves",
                newest,
                extra={"version": self.worker.version, "newest": newest},
            )
            self.options["take_starts"] = take
            if take:
                self.worker.wake_local()
        return take

    async def run(self, signal: StopSignal) -> None:
        if self.worker.only_thread is not None:
            return
        while True:
            try:
                await self.refresh()
            except WakefulError as exc:
                log.warning("reading the fleet's versions failed: %s", exc)
            if await signal.pause(self.interval):
                return


__all__ = ["StartGate", "arrivals", "newest_version", "takes_starts"]
