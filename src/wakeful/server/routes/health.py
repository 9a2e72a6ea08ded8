"""Liveness, readiness and Prometheus metrics (no token needed)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Response

from wakeful.errors import StoreUnavailable
from wakeful.fleet.census import DEFAULT_STALE_AFTER, liveness
from wakeful.fleet.webhooks import webhook_counts
from wakeful.metrics import CONTENT_TYPE, Gauge
from wakeful.records import DispatchStatus
from wakeful.server.access import ServerState, StateDep
from wakeful.server.keygauges import key_gauges
from wakeful.server.schemas import Health, Readiness
from wakeful.server.views import errors
from wakeful.store.contract import RateLimitStore

WEBHOOK_SCAN = 1000

router = APIRouter(tags=["health"])
log = logging.getLogger("wakeful.server")

READY_TIMEOUT = 5.0
QUEUE_STATUSES: tuple[DispatchStatus, ...] = (
    "scheduled",
    "queued",
    "pending",
    "leased",
    "awaiting",
    "quarantined",
)


@router.get("/healthz")
async def healthz() -> Health:
    """The process is up (it does not touch the store)."""
    return Health(status="ok")


@router.get("/readyz", responses=errors(503), response_model_exclude_none=True)
async def readyz(state: StateDep) -> Readiness:
    """The store answers a cheap read within a few seconds; 503 otherwise. A PostgreSQL
    store also reports its server: role, replication, pooler mode, clock skew, warnings."""
    report: dict[str, Any] | None = None
    try:
        await asyncio.wait_for(state.store.read("wakeful-readyz"), READY_TIMEOUT)
        server_report = getattr(state.store, "server_report", None)
        if server_report is not None:
            found = await asyncio.wait_for(server_report(), READY_TIMEOUT)
            report = found.to_json()
    except TimeoutError:
        raise StoreUnavailable(f"no answer within {READY_TIMEOUT} s") from None
    except StoreUnavailable:
        raise
    except Exception as exc:
        log.warning("readiness check failed: %s: %s", type(exc).__name__, exc)
        raise StoreUnavailable(type(exc).__name__) from None
    return Readiness(status="ok", server=report)


async def _queue_gauges(state: ServerState) -> list[Gauge]:
    bound = state.queue_depth_bound
    # One store call: each status counted over its index range, up to the bound.
    counts = await state.store.queue_depths(limit=bound)
    depth: dict[tuple[str, ...], float] = {
        (status,): float(counts[status]) for status in QUEUE_STATUSES
    }
    capped: dict[tuple[str, ...], float] = {
        (status,): 1.0 if counts[status] >= bound else 0.0 for status in QUEUE_STATUSES
    }
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
            f"Dispatches leased to a worker (at most {bound} counted; a lapsed lease counts "
            "until its dispatch is claimed again).",
            (),
            {(): float(counts["leased"])},
        ),
    ]


async def _worker_gauges(state: ServerState) -> list[Gauge]:
    now = datetime.now(UTC)
    workers = await state.store.list_workers()
    live = sum(1 for w in workers if liveness(w, now) == "alive")
    return [
        Gauge(
            "wakeful_workers_live",
            f"Registered workers with a heartbeat in the last {DEFAULT_STALE_AFTER:g} s "
            "that have not stopped.",
            (),
            {(): float(live)},
        )
    ]


async def _webhook_gauges(state: ServerState) -> list[Gauge]:
    counts = await webhook_counts(state.store, scan=WEBHOOK_SCAN)
    return [
        Gauge(
            "wakeful_webhooks",
            f"Webhook deliveries by status (pending: failed attempts, another one due; "
            f"delivered; dead: given up or refused), counted at scrape time among the first "
            f"{WEBHOOK_SCAN} webhook threads.",
            ("status",),
            {(status,): float(n) for status, n in counts.items()},
        )
    ]


async def _limit_gauges(state: ServerState) -> list[Gauge]:
    """Each rate-limit key's bucket as the store holds it now (a store without buckets:
    none). Keys are the few configured on providers, so the label set stays small."""
    store = state.store
    if not isinstance(store, RateLimitStore):
        return []
    buckets = await store.limit_buckets()

    def known(field: str) -> dict[tuple[str, ...], float]:
        found = ((b.key, getattr(b, field)) for b in buckets)
        return {(key,): float(value) for key, value in found if value is not None}

    blocked: dict[tuple[str, ...], float] = {
        (b.key,): 0.0 if b.blocked_until is None else b.blocked_until.timestamp() for b in buckets
    }
    return [
        Gauge(
            "wakeful_limit_requests_available",
            "Requests a rate-limit key's bucket holds now (negative: a debt being refilled).",
            ("key",),
            known("requests_available"),
        ),
        Gauge(
            "wakeful_limit_tokens_available",
            "Tokens a rate-limit key's bucket holds now (negative: a debt being refilled).",
            ("key",),
            known("tokens_available"),
        ),
        Gauge(
            "wakeful_limit_requests_per_minute",
            "The requests per minute last configured for a rate-limit key.",
            ("key",),
            known("requests_per_minute"),
        ),
        Gauge(
            "wakeful_limit_tokens_per_minute",
            "The tokens per minute last configured for a rate-limit key.",
            ("key",),
            known("tokens_per_minute"),
        ),
        Gauge(
            "wakeful_limit_waiting_runs",
            "Runs whose model call waits for a rate-limit key's bucket now.",
            ("key",),
            {(b.key,): float(len(b.waiting)) for b in buckets},
        ),
        Gauge(
            "wakeful_limit_blocked_until_seconds",
            "Unix time until which a provider's 429 blocks a rate-limit key (0: not blocked).",
            ("key",),
            blocked,
        ),
    ]


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
async def metrics(state: StateDep) -> Response:
    """Prometheus text format: HTTP requests by route and status, submits, conflicts,
    stale claims, worker counters, queue depth by status (computed now, bounded) and each
    rate-limit key's bucket (available, rates, blocked until, waiting runs) and each
    concurrency key in use (limit, admitted, waiting)."""
    gauges: list[Gauge] = []
    try:
        gauges = await _queue_gauges(state) + await _worker_gauges(state)
        gauges += await _limit_gauges(state) + await _webhook_gauges(state)
        gauges += await key_gauges(state.store)
        up = 1.0
    except Exception as exc:
        log.warning("metrics: queue depth unavailable: %s: %s", type(exc).__name__, exc)
        up = 0.0
    gauges.append(Gauge("wakeful_store_up", "1 when the store answered the scrape.", (), {(): up}))
    return Response(state.metrics.render(gauges), media_type=CONTENT_TYPE)
