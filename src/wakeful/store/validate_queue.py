"""Input validation of the dispatch queue's arguments at the store boundary, shared by every
backend (``wakeful.store.validate`` holds the rest and the JSON rules these use)."""

from __future__ import annotations

from wakeful.concurrency import check_concurrency_key
from wakeful.errors import InvalidInput
from wakeful.ids import check_aware, check_count, check_id, check_optional_id
from wakeful.records import IF_BUSY, Dispatch, DispatchStatus
from wakeful.store.validate import (
    MAX_DISPATCH_BYTES,
    canonical,
    check_json,
    json_roundtrip,
)


def check_dispatch(dispatch: Dispatch) -> Dispatch:
    if not isinstance(dispatch, Dispatch):
        raise InvalidInput("dispatch", f"must be a Dispatch, got {type(dispatch).__name__}")
    check_json("payload", dispatch.payload)
    copy = json_roundtrip("dispatch", dispatch, Dispatch, MAX_DISPATCH_BYTES)
    check_id("dispatch_id", copy.dispatch_id)
    check_id("thread_id", copy.thread_id)
    check_optional_id("dedupe_key", copy.dedupe_key)
    check_optional_id("debounce_key", copy.debounce_key)
    check_optional_id("tenant", copy.tenant)
    if copy.max_attempts < 1:
        raise InvalidInput("max_attempts", "must be at least 1")
    check_if_busy(copy)
    if not -(2**31) <= copy.priority < 2**31:
        raise InvalidInput("priority", "must fit in 32 bits")
    if copy.available_at is not None:
        check_aware("available_at", copy.available_at)
    check_concurrency(copy)
    return copy


def check_concurrency(d: Dispatch) -> None:
    """A dispatch names a concurrency key and its limit together, or neither; a cancel
    takes none (it bypasses admission). The key is any text of 1 to ``MAX_CONCURRENCY_KEY``
    characters without control characters (``tenant:acme``, ``model:gpt-4o``)."""
    key, limit = d.concurrency_key, d.concurrency_limit
    if key is None and limit is None:
        return
    if key is None or limit is None:
        raise InvalidInput("concurrency_key", "give concurrency_key and concurrency_limit together")
    if d.kind == "cancel":
        raise InvalidInput("concurrency_key", "a cancel takes no concurrency key")
    check_concurrency_key(key)
    if isinstance(limit, bool) or not 1 <= limit < 2**31:
        raise InvalidInput("concurrency_limit", "must be an integer from 1 to 2**31 - 1")


def check_if_busy(d: Dispatch) -> None:
    """``if_busy`` is a known policy the store can honour for ``d``'s kind: only a run's
    dispatch (``start``, ``message``) takes a policy."""
    if d.if_busy not in IF_BUSY:
        raise InvalidInput("if_busy", f"must be one of {sorted(IF_BUSY)}")
    if d.if_busy != "enqueue" and d.kind not in RUN_KINDS:
        raise InvalidInput("if_busy", f"applies to {sorted(RUN_KINDS)} dispatches only")


FENCING = frozenset(("interrupt", "rollback"))
"""The policies that fence the busy run (through a cancel intent naming the submission)."""
RUN_KINDS = frozenset(("start", "message"))
"""The dispatch kinds that start a run and so wait for their thread's run slot."""
SLOT_HOLDING = frozenset(("waiting_key", "pending", "leased", "awaiting", "quarantined"))
"""The statuses in which a dispatch (of any kind) holds its thread's run slot; a
``scheduled`` one holds it too once it was leased (``holds_slot``)."""
KEY_HOLDING = frozenset(("pending", "leased"))
"""The statuses in which a dispatch with a ``concurrency_key`` holds one of its key's slots
(a lapsed lease is still ``leased``: it keeps its slot until it is leased again)."""


def holds_slot(d: Dispatch) -> bool:
    """Whether ``d`` holds its thread's run slot: in a ``SLOT_HOLDING`` status, or
    ``scheduled`` after a lease (a ``Retry(delay)``, a durable sleep: its run is unfinished).
    A ``scheduled`` dispatch never leased (a delayed submission) holds nothing: it is
    admitted when it is due (decision 0035, amendment of issue 38)."""
    return d.status in SLOT_HOLDING or (d.status == "scheduled" and d.attempts > 0)


def same_request(a: Dispatch, b: Dispatch) -> bool:
    """The contract's notion of an identical enqueue: thread, kind, dedupe key, tenant and
    the payload as JSON (key order ignored)."""
    return (a.thread_id, a.kind, a.dedupe_key, a.tenant) == (
        b.thread_id,
        b.kind,
        b.dedupe_key,
        b.tenant,
    ) and canonical(a.payload) == canonical(b.payload)


DISPATCH_STATUSES = frozenset(
    ("scheduled", "queued", "waiting_key", "pending", "leased", "awaiting", "done", "quarantined")
)


def check_listing(
    status: object, thread_id: object, after: object, limit: object, tenant: object = None
) -> int:
    """The arguments of ``list_dispatches``; returns the page size."""
    if status is not None and status not in DISPATCH_STATUSES:
        raise InvalidInput("status", f"must be one of {sorted(DISPATCH_STATUSES)}")
    check_optional_id("thread_id", thread_id)
    check_optional_id("tenant", tenant)
    check_optional_id("after", after)
    return check_count("limit", limit, minimum=1)


QUEUE_DEPTH_STATUSES: tuple[DispatchStatus, ...] = (
    "scheduled",
    "queued",
    "waiting_key",
    "pending",
    "leased",
    "awaiting",
    "quarantined",
)
"""The statuses ``queue_depths`` counts: open work (``done`` is history)."""


def check_depth_limit(limit: object) -> int:
    """The argument of ``queue_depths``."""
    return check_count("limit", limit, minimum=1, maximum=2**31 - 1)


def check_version(version: str | None) -> str | None:
    """A worker's code version: ``None``, or an identifier (``2026-12-07.1``, a hash)."""
    return check_optional_id("version", version)
