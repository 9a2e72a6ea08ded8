"""Liveness, readiness and Prometheus metrics (no token needed)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Response

from wakeful.errors import StoreUnavailable
from wakeful.metrics import CONTENT_TYPE, Gauge
from wakeful.records import DispatchStatus
from wakeful.server.access import ServerState, StateDep
from wakeful.server.schemas import Health
from wakeful.server.views import errors

router = APIRouter(tags=["health"])
log = logging.getLogger("wakeful.server")

READY_TIMEOUT = 5.0
QUEUE_STATUSES: tuple[DispatchStatus, ...] = ("pending", "leased", "awaiting", "quarantined")
PAGE = 1000
WORKER_LIVE = timedelta(seconds=60)
"""A worker counts as live while its last heartbeat is this recent (a worker heartbeats
every ttl/3: 10 s with the default 30 s ttl)."""


@router.get("/healthz")
async def healthz() -> Health:
    """The process is up (it does not touch the store)."""
    return Health(status="ok")


@router.get("/readyz", responses=errors(503))
async def readyz(state: StateDep) -> Health:
    """The store answers a cheap read within a few seconds; 503 otherwise."""
    try:
        await asyncio.wait_for(state.store.read("wakeful-readyz"), READY_TIMEOUT)
    except TimeoutError:
        raise StoreUnavailable(f"no answer within {READY_TIMEOUT} s") from None
    except StoreUnavailable:
        raise
    except Exception as exc:
        log.warning("readiness check failed: %s: %s", type(exc).__name__, exc)
        raise StoreUnavailable(type(exc).__name__) from None
    return Health(status="ok")


async def _queue_gauges(state: ServerState) -> list[Gauge]:
    # The store contract has no cheap count yet (issue 27): the bounded paging stays.
    depth: dict[tuple[str, ...], float] = {}
    capped: dict[tuple[str, ...], float] = {}
    bound = state.queue_depth_bound
    now = datetime.now(UTC)
    live_leases = 0
    for status in QUEUE_STATUSES:
        count, after = 0, None
        while count < bound:
            want = min(PAGE, bound - count)
            rows = await state.store.list_dispatches(status=status, after=after, limit=want)
            count += len(rows)
            live_leases += sum(
                1 for d in rows if d.lease_until is not None and d.lease_until >= now
            )
            if len(rows) < want:
                break
            after = rows[-1].dispatch_id
        depth[(status,)] = float(count)
        capped[(status,)] = 1.0 if count >= bound else 0.0
    return [
        Gauge(
            "wakeful_queue_depth",
            f"Dispatches by status, counted at scrape time (at most {bound}).",
            ("status",),
            depth,
        ),
        Gauge(
            "wakeful_queue_depth_capped",
            "1 when the count reached its bound and the true depth may be larger.",
            ("status",),
            capped,
        ),
        Gauge(
            "wakeful_leases_live",
            f"Leased dispatches whose lease has not expired (of at most {bound} counted).",
            (),
            {(): float(live_leases)},
        ),
    ]


async def _worker_gauges(state: ServerState) -> list[Gauge]:
    since = datetime.now(UTC) - WORKER_LIVE
    workers = await state.store.list_workers()
    live = sum(1 for w in workers if w.last_heartbeat >= since)
    return [
        Gauge(
            "wakeful_workers_live",
            f"Registered workers with a heartbeat in the last {WORKER_LIVE.seconds} s.",
            (),
            {(): float(live)},
        )
    ]


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
async def metrics(state: StateDep) -> Response:
    """Prometheus text format: HTTP requests by route and status, submits, conflicts,
    stale claims, worker counters, and queue depth by status (computed now, bounded)."""
    gauges: list[Gauge] = []
    try:
        gauges = await _queue_gauges(state) + await _worker_gauges(state)
        up = 1.0
    except Exception as exc:
        log.warning("metrics: queue depth unavailable: %s: %s", type(exc).__name__, exc)
        up = 0.0
    gauges.append(Gauge("wakeful_store_up", "1 when the store answered the scrape.", (), {(): up}))
    return Response(state.metrics.render(gauges), media_type=CONTENT_TYPE)
