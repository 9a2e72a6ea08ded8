"""How a worker counts and logs the end of a dispatch attempt: ``done``, ``awaiting`` (its run
suspended for answers), ``sleeping`` (its run asleep in ``ctx.sleep``: the dispatch is due
again at the wake time; counted apart from runs waiting for answers and from retries) or
``retry`` (a failed attempt, due again after its backoff)."""

from __future__ import annotations

import logging
from typing import Any

from wakeful.fleet.attempts import Settled, log_end, log_fields, next_step
from wakeful.fleet.observe import WorkerStats
from wakeful.metrics import Metrics
from wakeful.records import Awaiting, Dispatch, Outcome, Retry


def account(
    log: logging.Logger,
    stats: WorkerStats,
    metrics: Metrics,
    d: Dispatch,
    fields: dict[str, Any],
    started: float,
    settled: Outcome | Settled,
    ending: str | None,
) -> str:
    """Count and log the attempt at ``d`` that ended ``settled`` (``ending``: how its work
    ended, for the log line); the name of the ending."""
    asleep = isinstance(settled, Settled) and settled.wake_at is not None
    outcome = settled.outcome if isinstance(settled, Settled) else settled
    if asleep:
        log_end(log, d, fields, started, "sleeping", ending)
        stats.sleeping += 1
        metrics.settles.inc(outcome="sleeping")
        return "sleeping"
    if isinstance(outcome, Retry):
        log.warning(
            "dispatch %s attempt %d of %d failed; %s: %s",
            d.dispatch_id,
            d.attempts,
            d.max_attempts,
            next_step(d, outcome.delay),
            outcome.error,
            extra={**(fields or log_fields(d)), "outcome": "retry", "reason": outcome.error},
        )
        log_end(log, d, fields, started, "retry", outcome.error)
        stats.retried += 1
        metrics.retries.inc()
        metrics.settles.inc(outcome="retry")
        return "retry"
    if isinstance(outcome, Awaiting):
        log_end(log, d, fields, started, "awaiting", ending)
        stats.awaiting += 1
        metrics.settles.inc(outcome="awaiting")
        return "awaiting"
    log_end(log, d, fields, started, "done", ending)
    stats.done += 1
    metrics.settles.inc(outcome="done")
    return "done"


__all__ = ["account"]
