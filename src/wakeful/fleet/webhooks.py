"""Delivering the webhooks runs stage when they end (issue 43; ``wakeful.runtime.webhooks``).

The staged outbox entry travels the ordinary outbox: the relay puts it in the inbox of the
webhook's own thread ``wakeful.webhook.<id>`` and queues a ``message`` dispatch there; a
worker that leases it POSTs the body here instead of running a graph. So a delivery has
what every dispatch has: a lease (one worker at a time), retries by the store's clock, and
a fenced record. At least once: a worker killed after the POST and before its record
leaves the dispatch to lapse and be leased again, and the receiver gets the same
``webhook-id`` (the id is the entry's, fixed when the run ended) with a new timestamp and
signature.

Each attempt's outcome is one commit on the webhook thread, carrying the settle of its
dispatch: a checkpoint whose state is the delivery record (``WebhookRecord`` fields) and a
``webhook.delivered``, ``webhook.failed`` or ``webhook.dead`` event. The run status of
that checkpoint says where the delivery is: ``running`` (pending: failed attempts, another
one is due at ``next_attempt_at``), ``completed`` (delivered) or ``failed`` (dead: it was
still failing ``max_age`` seconds after the run ended, or its address was refused). A
delivered or dead webhook consumes its inbox entry in that commit.

Retries: the ``n``-th failed attempt waits ``backoff_delay(n, initial_backoff,
max_backoff)`` (5 s doubling to at most an hour by default), never past the deadline
``created + max_age`` (a day): the last attempt is at the deadline, and a failure then is
final."""

from __future__ import annotations

import functools
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from wakeful.backoff import backoff_delay
from wakeful.clock import Clock
from wakeful.errors import InvalidInput
from wakeful.fleet.attempts import Settled
from wakeful.fleet.webhook_signing import (
    Target,
    check_webhook_url,
    redact_url,
    resolve,
    secret_key,
    sign,
)
from wakeful.metrics import Metrics
from wakeful.records import (
    Checkpoint,
    Commit,
    Done,
    EventDraft,
    Lease,
    Outcome,
    Retry,
    Settle,
)
from wakeful.runtime.webhooks import WEBHOOK_THREAD_PREFIX
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.fleet")

SECRET_ENV = "WAKEFUL_WEBHOOK_SECRET"
"""The environment variable ``wakeful worker`` reads the signing secret(s) from (several:
separated by spaces, for rotation)."""
STATUS = {"running": "pending", "completed": "delivered", "failed": "dead"}
"""The delivery status each run status of a webhook thread's checkpoint stands for."""


@dataclass(frozen=True)
class WebhookConfig:
    """How a worker delivers webhooks. ``secrets``: ``whsec_...`` signing secrets (each
    signs; the first is the current one); a worker without one fails its attempts (they
    are retried: another worker may have it). ``allow_private``: deliver to addresses that
    are not globally routable (loopback included: tests and single-host setups)."""

    secrets: tuple[str, ...] = ()
    allow_private: bool = False
    max_age: float = 24 * 3600.0
    initial_backoff: float = 5.0
    max_backoff: float = 3600.0
    timeout: float = 10.0
    ca_file: str | None = None
    """Certificates (PEM) that https receivers' certificates must chain to, instead of the
    system's: receivers behind a private CA."""

    def __post_init__(self) -> None:
        for secret in self.secrets:
            secret_key(secret)
        if not 0 < self.initial_backoff <= self.max_backoff:
            raise InvalidInput("initial_backoff", "must be > 0 and at most max_backoff")
        if not self.max_age > 0 or not self.timeout > 0:
            raise InvalidInput("max_age", "max_age and timeout must be > 0")

    @classmethod
    def from_env(cls, secrets: Sequence[str] = (), allow_private: bool = False) -> WebhookConfig:
        """``secrets`` if any, else those of ``WAKEFUL_WEBHOOK_SECRET``."""
        found = tuple(secrets) or tuple(os.environ.get(SECRET_ENV, "").split())
        return cls(secrets=found, allow_private=allow_private)


class WebhookRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A webhook delivery as its thread records it (and the console lists it)."""

    webhook_id: str
    status: str
    """``pending``, ``delivered`` or ``dead``."""
    url: str
    """Redacted: no query string."""
    thread_id: str
    run_id: str
    event: str
    attempts: int = 0
    last_error: str | None = None
    last_status: int | None = None
    next_attempt_at: str | None = None
    created_at: str | None = None
    updated_at: str | None = None


def run_metadata(payload: dict[str, Any], target: Any, version: str | None) -> dict[str, Any]:
    """What a worker's run records in its first checkpoint: its target's name, the code
    ``version`` and its webhook URL (the submission's, else the target's, if any)."""
    metadata = {"target": target.name, "version": version}
    url = payload.get("webhook") or getattr(target, "webhook", None)
    if isinstance(url, str):
        metadata["webhook"] = url
    return metadata


async def deliver(
    store: Store, lease: Lease, config: WebhookConfig, clock: Clock, metrics: Metrics
) -> Outcome | Settled:
    """One delivery attempt of the webhook leased by ``lease`` (a ``message`` dispatch on a
    ``wakeful.webhook.`` thread), recorded and settled in one commit."""
    d, claim = lease.dispatch, lease.claim
    payload = d.payload if isinstance(d.payload, dict) else {}
    message_id = str(payload.get("message_id"))
    waiting = {m.message_id: m for m in await store.inbox(d.thread_id)}
    if message_id not in waiting:
        return Done()  # delivered (or dead) before: the record consumed it
    entry = waiting[message_id].payload
    snap = lease.snapshot if lease.snapshot is not None else await store.read(d.thread_id)
    latest = snap.checkpoint if snap is not None else None
    now = await store.store_now()
    created = d.created_at or now
    deadline = created + timedelta(seconds=config.max_age)
    attempt = _Attempt(d.thread_id, d.dispatch_id, claim.token, entry, latest, now, created)
    if now > deadline:  # a lapsed lease came back after the deadline: nothing is sent
        ended = f"not delivered within {config.max_age:g} s"
        return await attempt.record(store, clock, metrics, "dead", ended, sent=False)
    url, error, target = str(entry["url"]), None, None
    try:
        check_webhook_url(url)  # a URL put in a run's metadata by hand is checked here
        target = await resolve(url, config.allow_private)
    except InvalidInput as exc:
        target = str(exc)
    except OSError as exc:  # the name does not resolve (now): an ordinary failure
        error = f"{redact_url(url)}: {exc}"
    if isinstance(target, str):
        why = f"refused: {target}"
        return await attempt.record(store, clock, metrics, "dead", why, sent=False)
    status = None
    if target is not None:
        # the POST ends well inside the lease: a lapsed lease lets another worker send too
        left = (claim.expires_at - now).total_seconds() * 0.8
        timeout = max(min(config.timeout, left), 1.0)
        status, error = await _post(entry, target, config, clock, timeout)
    if error is None:
        return await attempt.record(store, clock, metrics, "delivered", None, status)
    if now >= deadline:
        return await attempt.record(store, clock, metrics, "dead", error, status)
    n = attempt.attempts
    delay = backoff_delay(n, config.initial_backoff, config.max_backoff)
    delay = min(delay, (deadline - now).total_seconds())
    return await attempt.record(store, clock, metrics, "pending", error, status, delay)


async def _post(
    entry: dict[str, Any], target: Target, config: WebhookConfig, clock: Clock, timeout: float
) -> tuple[int | None, str | None]:
    """POST the body to ``target``'s checked address: ``(status, None)`` on a 2xx answer,
    else ``(status or None, why)``. Redirects are not followed (a redirect could lead to a
    refused address); the answer's body is never read (a receiver cannot make a worker
    hold a large one)."""
    import httpx

    if not config.secrets:
        return None, "this worker has no webhook secret (--webhook-secret, WAKEFUL_WEBHOOK_SECRET)"
    body = msgspec.json.encode(entry["body"])
    stamp = int(clock.now().timestamp())
    headers = {
        **sign(config.secrets, str(entry["webhook_id"]), stamp, body),
        "content-type": "application/json",
        "user-agent": "wakeful-webhooks",
        "host": target.host_header,
    }
    url = str(entry["url"])
    shown = redact_url(url)
    tls = _tls(config.ca_file)
    client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, verify=tls)
    status = 0
    async with client as http:
        for address in target.addresses:
            pinned = target.pinned(address)
            try:
                async with http.stream(
                    "POST",
                    pinned,
                    content=body,
                    headers=headers,
                    extensions={"sni_hostname": target.server_name},
                ) as response:
                    status = response.status_code
                break
            except httpx.ConnectError as exc:
                failed: httpx.HTTPError = exc
                if address != target.addresses[-1]:
                    continue  # the name's next address
            except httpx.HTTPError as exc:
                failed = exc
            why = str(failed).replace(url, shown).replace(pinned, shown)
            return None, f"{shown}: {type(failed).__name__}: {why}"
    if 200 <= status < 300:
        return status, None
    return status, f"{shown} answered HTTP {status}"


@functools.cache
def _tls(ca_file: str | None) -> ssl.SSLContext:
    """One TLS context for every delivery (per CA file): building one (loading the CA
    bundle) cost about 50 ms of CPU per POST, more than everything else a delivery does."""
    return ssl.create_default_context(cafile=ca_file)


@dataclass
class _Attempt:
    thread_id: str
    dispatch_id: str
    token: int
    entry: dict[str, Any]
    latest: Checkpoint | None
    now: datetime
    created: datetime

    @property
    def attempts(self) -> int:
        """This attempt's number (recorded attempts + 1)."""
        state = self.latest.state if self.latest is not None else None
        recorded = state.get("attempts", 0) if isinstance(state, dict) else 0
        return int(recorded) + 1

    async def record(
        self,
        store: Store,
        clock: Clock,
        metrics: Metrics,
        status: str,
        error: str | None,
        http_status: int | None = None,
        delay: float = 0.0,
        *,
        sent: bool = True,
    ) -> Settled:
        """Commit the attempt's record and settle its dispatch (``Retry(delay)`` while
        ``pending``); ``sent``: whether a POST was made (counted in ``attempts``)."""
        body = self.entry.get("body") or {}
        data = body.get("data") or {}
        attempts = self.attempts if sent else self.attempts - 1
        nxt = self.now + timedelta(seconds=delay) if status == "pending" else None
        record = WebhookRecord(
            webhook_id=str(self.entry.get("webhook_id")),
            status=status,
            url=redact_url(str(self.entry.get("url"))),
            thread_id=str(data.get("thread_id")),
            run_id=str(data.get("run_id")),
            event=str(body.get("type")),
            attempts=attempts,
            last_error=error,
            last_status=http_status,
            next_attempt_at=nxt.isoformat() if nxt is not None else None,
            created_at=self.created.isoformat(),
            updated_at=self.now.isoformat(),
        )
        run_status = {v: k for k, v in STATUS.items()}[status]
        ordinal = int(self.latest.metadata.get("ordinal", 0)) + 1 if self.latest else 0
        checkpoint = Checkpoint(
            id=f"{record.webhook_id}-a{ordinal}",
            parent=self.latest.id if self.latest is not None else None,
            run_id=record.webhook_id,
            status=run_status,  # type: ignore[arg-type]
            state=msgspec.to_builtins(record),
            created_at=clock.now(),
            tenant=self.entry.get("tenant"),
            metadata={"ordinal": ordinal, "source": "webhook"},
        )
        outcome: Outcome = Retry(delay, error) if status == "pending" else Done()
        event = f"webhook.{'failed' if status == 'pending' else status}"
        commit = Commit(
            token=self.token,
            checkpoint=checkpoint,
            events=(EventDraft(type=event, data=msgspec.to_builtins(record)),),
            consume=(record.webhook_id,) if status != "pending" else (),
            settle=Settle(dispatch_id=self.dispatch_id, outcome=outcome),
        )
        await store.commit(self.thread_id, commit)
        metrics.webhooks.inc(outcome="failed" if status == "pending" else status)
        log_at = logging.INFO if status == "delivered" else logging.WARNING
        log.log(
            log_at,
            "webhook %s to %s %s after %d attempt(s)%s",
            record.webhook_id,
            record.url,
            status,
            attempts,
            f": {error}" if error else "",
        )
        return Settled(outcome)


async def recent_webhooks(
    store: Store, tenant: str | None = None, limit: int = 50, scan: int = 1000
) -> list[WebhookRecord]:
    """The ``limit`` most recently updated webhook deliveries of ``tenant`` (every tenant's
    when ``None``), newest first, among the first ``scan`` webhook threads (an index range
    of ``list_threads``; a delivery not attempted yet has no record and is not listed)."""
    summaries = await _webhook_threads(store, tenant, scan)
    summaries.sort(key=lambda s: s.updated_at, reverse=True)
    records = []
    for summary in summaries[:limit]:
        snap = await store.read(summary.thread_id)
        cp = snap.checkpoint if snap is not None else None
        if cp is not None and isinstance(cp.state, dict):
            records.append(msgspec.convert(cp.state, WebhookRecord))
    return records


async def webhook_counts(
    store: Store, tenant: str | None = None, scan: int = 1000
) -> dict[str, int]:
    """How many of the first ``scan`` webhook threads (``tenant``'s when given) are
    ``pending``, ``delivered`` and ``dead`` (a total equal to ``scan`` means "at least")."""
    counts = dict.fromkeys(("pending", "delivered", "dead"), 0)
    for summary in await _webhook_threads(store, tenant, scan):
        status = STATUS.get(str(summary.status))
        if status is not None:
            counts[status] += 1
    return counts


async def prune_webhooks(store: Store, max_age: float, scan: int = 10_000) -> int:
    """Delete the threads of finished deliveries (delivered or dead) whose last record is
    older than ``max_age`` seconds by the store's clock, among the first ``scan`` webhook
    threads; how many went. The relay's sweep calls it with the retention policy's
    ``settled_dispatch_max_age``: a delivery's record is kept as long as its dispatch."""
    now = await store.store_now()
    gone = 0
    for summary in await _webhook_threads(store, None, scan):
        finished = STATUS.get(str(summary.status)) in ("delivered", "dead")
        if finished and (now - summary.updated_at).total_seconds() > max_age:
            await store.delete_thread(summary.thread_id)
            gone += 1
    return gone


async def _webhook_threads(store: Store, tenant: str | None, scan: int) -> list[Any]:
    found: list[Any] = []
    after = WEBHOOK_THREAD_PREFIX
    while len(found) < scan:
        page = await store.list_threads(tenant=tenant, after=after, limit=min(200, scan))
        mine = [s for s in page if s.thread_id.startswith(WEBHOOK_THREAD_PREFIX)]
        found.extend(mine[: scan - len(found)])
        if len(mine) < len(page) or len(page) < min(200, scan):
            break
        after = page[-1].thread_id
    return found


__all__ = [
    "SECRET_ENV",
    "WebhookConfig",
    "WebhookRecord",
    "deliver",
    "prune_webhooks",
    "recent_webhooks",
    "run_metadata",
    "webhook_counts",
]
