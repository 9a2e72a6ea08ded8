"""Submitting work: every call persists a dispatch before anything acts on it.

A ``tenant`` travels as ``Dispatch.tenant`` (the store fixes the thread's tenant with the
enqueue and refuses another tenant's, ``TenantMismatch``) and, for workers of earlier
versions, in the payload too."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from wakeful import telemetry
from wakeful.concurrency import Concurrency, concurrency_of
from wakeful.errors import DispatchConflict, InvalidInput
from wakeful.fleet.delays import debounce_seconds, not_before
from wakeful.fleet.wake import Wake
from wakeful.fleet.webhook_signing import check_webhook_url
from wakeful.ids import check_id, check_optional_id
from wakeful.records import Dispatch, IfBusy
from wakeful.runtime.history import committed_at, last_user_count, message_position
from wakeful.store.contract import DispatchQueue, Store

TRACE_FIELD = "trace"
"""The payload field with the submitter's W3C trace context (only while tracing is on):
the worker that leases the dispatch continues that trace."""


def tenant_of(d: Dispatch) -> str | None:
    """The tenant ``d`` was submitted for: its ``tenant``, else the tenant its payload names
    (a start, resume or message queued before dispatches carried one), else ``None``."""
    if d.tenant is not None:
        return d.tenant
    if d.kind in ("start", "resume", "message") and isinstance(d.payload, dict):
        named = d.payload.get("tenant")
        return named if isinstance(named, str) else None
    return None


async def _enqueue(queue: DispatchQueue, dispatch: Dispatch, wake: Wake | None) -> Dispatch:
    attributes = {
        "wakeful.dispatch.id": dispatch.dispatch_id,
        "wakeful.dispatch.kind": dispatch.kind,
        "wakeful.thread.id": dispatch.thread_id,
        "messaging.operation.type": "send",
    }
    producer = telemetry.kind("producer")
    with telemetry.span(f"wakeful.submit {dispatch.kind}", attributes, kind=producer):
        carrier = telemetry.inject()
        if carrier and isinstance(dispatch.payload, dict):
            payload = {**dispatch.payload, TRACE_FIELD: carrier}
            dispatch = msgspec.structs.replace(dispatch, payload=payload)
        try:
            stored = await queue.enqueue(dispatch)
        except DispatchConflict as conflict:
            stored = await _replayed(queue, dispatch, conflict)
    if wake is not None:
        await wake.notify()
    return stored


def _untraced(payload: object) -> object:
    """The payload as JSON would carry it, without the trace context."""
    if isinstance(payload, dict):
        payload = {k: v for k, v in payload.items() if k != TRACE_FIELD}
    return msgspec.json.decode(msgspec.json.encode(payload))


async def _replayed(
    queue: DispatchQueue, dispatch: Dispatch, conflict: DispatchConflict
) -> Dispatch:
    """A resubmission that differs from the stored dispatch only by its trace context is
    the same request (its first trace stands); anything else re-raises the conflict."""
    stored = await queue.get_dispatch(dispatch.dispatch_id)
    same = stored is not None and (
        (stored.thread_id, stored.kind, stored.dedupe_key, _untraced(stored.payload))
        == (dispatch.thread_id, dispatch.kind, dispatch.dedupe_key, _untraced(dispatch.payload))
    )
    if stored is None or not same:
        raise conflict
    return stored


async def submit(
    store: DispatchQueue,
    thread_id: str,
    target: str,
    input: Any = None,
    *,
    dispatch_id: str | None = None,
    priority: int = 0,
    max_attempts: int = 5,
    tenant: str | None = None,
    wake: Wake | None = None,
    after: float | timedelta | None = None,
    at: datetime | None = None,
    from_checkpoint: str | None = None,
    keep_messages: int | None = None,
    if_busy: IfBusy = "enqueue",
    webhook: str | None = None,
    debounce: float | timedelta | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    concurrency: Concurrency | Mapping[str, Any] | None = None,
) -> Dispatch:
    """Ask for a new run of ``target`` (a registered agent or graph) on ``thread_id``.
    Idempotent by ``dispatch_id``: submitting the same id and input again returns the same
    dispatch. The run id is ``run-<dispatch_id>``.

    ``after`` (seconds or a ``timedelta``, measured by the store's clock) or ``at`` (a
    timezone-aware instant) delays the run: the dispatch is stored now and claimable from
    then on (``Dispatch.available_at``); ``cancel`` before then and it never runs.
    ``from_checkpoint``: replay from that earlier checkpoint of the thread instead
    (``Runtime.replay``): the worker's run starts from its state, the messages as of it and
    its frontier, or with ``input`` (not ``None``) from ``START`` on its state; from a
    checkpoint other than the head the thread branches (docs/time-travel.md).
    ``keep_messages``: with ``from_checkpoint``, keep only that many of the messages as of
    it (``Runtime.replay``'s: what editing a message needs).
    ``if_busy``: what to do when the thread is busy (a run of it is unfinished: running,
    queued or suspended): ``"enqueue"`` waits (the dispatch is ``queued``, see its
    ``queued_behind``), ``"reject"`` raises ``ThreadBusy`` naming the busy run and stores
    nothing, ``"interrupt"`` waits while the busy run is stopped (it ends ``interrupted``),
    ``"rollback"`` waits while the busy run is stopped and undone (the thread returns to
    where it was before that run started; ``run.rolled_back`` lists its tool calls that
    took effect), ``"coalesce"`` merges with the other coalesce submissions waiting with it
    into one run (docs/busy-threads.md).
    ``webhook``: a URL the fleet POSTs a signed JSON body to when the run ends (completed,
    failed, cancelled, interrupted, indeterminate) or suspends on a question, instead of
    the target's (docs/composition.md#webhooks-when-a-run-ends).
    ``debounce`` (seconds or a ``timedelta``, by the store's clock): a burst of
    submissions of ``target`` to the thread within the window starts one run, with the last
    input (docs/flow-control.md#debounce). The run starts ``debounce`` after the last
    submission; while it has not started, a submission replaces its input and moves its
    start, and returns *that* dispatch (its id, which may not be ``dispatch_id``: the run id
    is ``run-<its id>``). Not with ``after``/``at``, ``from_checkpoint``,
    ``keep_messages`` or a concurrency key.
    ``concurrency_key`` with ``concurrency_limit``: at most that many runs of the key are
    admitted at once across the fleet; this one waits (``waiting_key``) while the key is
    full. ``concurrency``: the target's rule (``Target.concurrency``, or ``{"key": "tenant",
    "limit": 5}``), which gives the key from the tenant or the input when
    ``concurrency_key`` is not given (docs/flow-control.md)."""
    check_id("target", target)
    if webhook is not None:
        check_webhook_url(webhook)
    check_optional_id("tenant", tenant)
    check_optional_id("from_checkpoint", from_checkpoint)
    if keep_messages is not None and (from_checkpoint is None or keep_messages < 0):
        raise InvalidInput("keep_messages", "needs from_checkpoint and must be >= 0")
    dispatch_id = check_id("dispatch_id", dispatch_id or f"d-{uuid.uuid4().hex}")
    available_at = None
    if after is not None or at is not None:
        available_at = not_before(await _store_now(store, after), after, at)
    if concurrency_key is None:
        rule = concurrency_of(concurrency)
        if rule is not None and (concurrency_key := rule.key_for(tenant, input)) is not None:
            concurrency_limit = rule.limit
    debounce_key = None
    if debounce is not None:
        window = debounce_seconds(debounce)
        if after is not None or at is not None or from_checkpoint is not None:
            raise InvalidInput("debounce", "not with after, at or from_checkpoint")
        if concurrency_key is not None:
            raise InvalidInput("debounce", "not with a concurrency key (not supported yet)")
        available_at = await _store_now(store, window) + timedelta(seconds=window)
        debounce_key = target  # one waiting run per (thread, target)
    payload = {"target": target, "input": input, "run_id": f"run-{dispatch_id}", "tenant": tenant}
    if debounce_key is not None:
        del payload["run_id"]  # the run is the one of the dispatch that takes it: run-<its id>
    if from_checkpoint is not None:  # absent otherwise: earlier payloads stay the same
        payload["from_checkpoint"] = from_checkpoint
    if keep_messages is not None:
        payload["keep_messages"] = keep_messages
    if webhook is not None:
        payload["webhook"] = webhook
    return await _enqueue(
        store,
        Dispatch(
            dispatch_id=dispatch_id,
            thread_id=thread_id,
            kind="start",
            payload=payload,
            priority=priority,
            max_attempts=max_attempts,
            tenant=tenant,
            available_at=available_at,
            if_busy=if_busy,
            debounce_key=debounce_key,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
        ),
        wake,
    )


async def _store_now(store: DispatchQueue, after: object) -> datetime:
    """The store's clock (``after`` is measured by it); a store without one is refused."""
    store_now = getattr(store, "store_now", None)
    if store_now is None:
        if after is None:  # ``at`` alone is checked against nothing later than it says
            return datetime.now(UTC)
        raise InvalidInput("after", f"{type(store).__name__} has no store_now(); pass at=")
    now: datetime = await store_now()
    return now


async def regenerate(
    store: Store,
    thread_id: str,
    target: str,
    *,
    dispatch_id: str | None = None,
    tenant: str | None = None,
    wake: Wake | None = None,
) -> Dispatch:
    """Ask for the agent ``target`` to answer the thread's last user message again, from
    the checkpoint that committed it (``Agent.regenerate`` through the fleet): a start
    dispatch ``from_checkpoint`` that checkpoint. The thread branches when it runs."""
    count = await last_user_count(store, thread_id)
    at = await committed_at(store, thread_id, count, tenant=tenant)
    return await submit(
        store,
        thread_id,
        target,
        dispatch_id=dispatch_id,
        tenant=tenant,
        wake=wake,
        from_checkpoint=at,
    )


async def edit_message(
    store: Store,
    thread_id: str,
    target: str,
    message_id: str,
    new_content: str,
    *,
    dispatch_id: str | None = None,
    tenant: str | None = None,
    wake: Wake | None = None,
) -> Dispatch:
    """Ask for the agent ``target`` to run on from an edited user message (``Agent.edit``
    through the fleet): a start dispatch with ``new_content`` as input, ``from_checkpoint``
    the checkpoint that committed ``message_id``, keeping only the messages before it.
    ``InvalidInput`` for a message that is not the user's, ``NotFound`` for one the
    thread's current messages do not have."""
    check_id("message_id", message_id)
    index, original = await message_position(store, thread_id, message_id)
    if original.role != "user":
        raise InvalidInput("message_id", f"{message_id!r} is a {original.role} message")
    at = await committed_at(store, thread_id, index + 1, tenant=tenant)
    return await submit(
        store,
        thread_id,
        target,
        new_content,
        dispatch_id=dispatch_id,
        tenant=tenant,
        wake=wake,
        from_checkpoint=at,
        keep_messages=index,
    )


async def resume(
    store: DispatchQueue,
    thread_id: str,
    answers: Mapping[str, Any],
    *,
    dispatch_id: str | None = None,
    priority: int = 0,
    max_attempts: int = 5,
    tenant: str | None = None,
    wake: Wake | None = None,
) -> Dispatch:
    """Ask for the suspended run on ``thread_id`` to continue with ``answers``."""
    check_optional_id("tenant", tenant)
    dispatch_id = check_id("dispatch_id", dispatch_id or f"d-{uuid.uuid4().hex}")
    return await _enqueue(
        store,
        Dispatch(
            dispatch_id=dispatch_id,
            thread_id=thread_id,
            kind="resume",
            payload={"answers": dict(answers), "tenant": tenant},
            priority=priority,
            max_attempts=max_attempts,
            tenant=tenant,
        ),
        wake,
    )


async def cancel(
    store: DispatchQueue, thread_id: str, reason: str = "cancelled", *, wake: Wake | None = None
) -> Dispatch:
    """Persist the intent to cancel the thread's work: its running owner is fenced at its
    next commit or renewal, and the next claimant records ``cancelled``."""
    dispatch = await store.cancel(thread_id, reason)
    if wake is not None:
        await wake.notify()
    return dispatch


async def send_message(
    store: DispatchQueue,
    thread_id: str,
    payload: Any,
    *,
    message_id: str | None = None,
    target: str | None = None,
    correlation_id: str | None = None,
    priority: int = 0,
    tenant: str | None = None,
    wake: Wake | None = None,
    dispatch_id: str | None = None,
    if_busy: IfBusy = "enqueue",
) -> Dispatch:
    """Deliver a message from outside to ``thread_id``: it starts a run of the thread's
    graph (or ``target``, or the registry's default) with the message as input, once:
    ``message_id`` deduplicates (through the dispatch id ``ext-<message_id>``, or
    ``dispatch_id`` when given: the HTTP API scopes a tenant's message ids so). Runs send to
    each other with ``ctx.send`` instead. ``if_busy``: as ``submit`` takes it
    (``"coalesce"``: three quick messages to a busy agent are answered by one turn)."""
    message_id = check_id("message_id", message_id or f"msg-{uuid.uuid4().hex}")
    check_optional_id("target", target)
    check_optional_id("correlation_id", correlation_id)
    check_optional_id("tenant", tenant)
    if dispatch_id is None:
        dispatch_id = f"ext-{message_id}"[:200]
    else:
        check_id("dispatch_id", dispatch_id)
    return await _enqueue(
        store,
        Dispatch(
            dispatch_id=dispatch_id,
            thread_id=thread_id,
            kind="message",
            payload={
                "message_id": message_id,
                "payload": payload,
                "target": target,
                "correlation_id": correlation_id,
                "external": True,
                "tenant": tenant,
            },
            priority=priority,
            dedupe_key=dispatch_id,
            tenant=tenant,
            if_busy=if_busy,
        ),
        wake,
    )
