"""The application's shared state, the request dependencies, and tenant isolation.

Who owns a thread: the tenant the store fixed for it (``ThreadSnapshot.tenant`` once
``tenant_bound``): by its first commit or, before it, by the first submitted work naming a
tenant. The store fixes it atomically with that write and refuses another tenant's write
(``TenantMismatch``, answered 404), so two tenants racing to submit to a new thread cannot
both get in. Work queued before dispatches carried a tenant (and work that names none) still
stands for its thread through the tenant its payload records. A thread of another tenant is
reported exactly like a missing one (404), for reads and writes alike; so is a dispatch
submitted for another tenant, whatever thread it is on.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from wakeful.errors import InvalidInput, NotFound
from wakeful.fleet.client import tenant_of
from wakeful.fleet.registry import Registry
from wakeful.fleet.wake import Wake
from wakeful.metrics import Metrics
from wakeful.records import Dispatch, ThreadSnapshot
from wakeful.server.auth import Caller
from wakeful.server.gateway import CALLER_KEY
from wakeful.server.problems import Forbidden
from wakeful.server.schemas import MAX_KEY
from wakeful.store.contract import Store

OWNER_SCAN = 50
"""Dispatches of a thread without commits looked at to find the tenant that queued work."""
SCOPE_DIGITS = 12
"""Hex digits of the tenant tag that scopes a tenant's idempotency keys and message ids."""


@dataclass
class ServerState:
    store: Store
    registry: Registry | None
    wake: Wake | None
    metrics: Metrics
    development: bool
    sse_keepalive: float = 15.0
    stream_max_seconds: float | None = None
    queue_depth_bound: int = 10_000
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the server shuts down: open event streams end so connections can close."""
    feeds: Any = None
    """The ``wakeful.server.feeds.Feeds`` of the thread streams."""


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.wakeful
    return state


def get_caller(request: Request) -> Caller:
    caller = request.scope.get(CALLER_KEY)
    if not isinstance(caller, Caller):  # a route outside /v1/ asked for a caller
        raise Forbidden("this route needs a bearer token")
    return caller


def require_operator(request: Request) -> Caller:
    caller = get_caller(request)
    if not caller.operator:
        raise Forbidden("this route is for operators (a token whose tenant is '*')")
    return caller


StateDep = Annotated[ServerState, Depends(get_state)]
CallerDep = Annotated[Caller, Depends(get_caller)]
OperatorDep = Annotated[Caller, Depends(require_operator)]


@dataclass(frozen=True)
class Owner:
    """A thread that exists for the API: committed (``snapshot.version > 0``) or with queued
    work only."""

    thread_id: str
    tenant: str | None
    snapshot: ThreadSnapshot | None

    @property
    def committed(self) -> bool:
        return self.snapshot is not None and self.snapshot.version > 0


def _queued_tenant(d: Dispatch) -> tuple[bool, str | None]:
    if d.kind in ("start", "resume", "message") and isinstance(d.payload, dict):
        if "tenant" in d.payload:
            tenant = d.payload.get("tenant")
            return True, tenant if isinstance(tenant, str) else None
        if d.kind == "message":
            return True, None
    return False, None


async def thread_owner(store: Store, thread_id: str) -> Owner | None:
    snap = await store.read(thread_id)
    if snap is not None and snap.tenant_bound:
        return Owner(thread_id, snap.tenant, snap)
    for d in await store.list_dispatches(thread_id=thread_id, limit=OWNER_SCAN):
        known, tenant = _queued_tenant(d)
        if known:
            return Owner(thread_id, tenant, snap)
    return None


def can_see(caller: Caller, owner: Owner | None) -> bool:
    return owner is not None and (caller.operator or owner.tenant == caller.tenant)


async def visible_thread(store: Store, caller: Caller, thread_id: str) -> Owner:
    """The thread, or ``NotFound`` when it does not exist or belongs to another tenant."""
    owner = await thread_owner(store, thread_id)
    if owner is None or not can_see(caller, owner):
        raise NotFound("thread", thread_id)
    return owner


async def writable_thread(store: Store, caller: Caller, thread_id: str) -> Owner | None:
    """The thread the caller may submit to: ``None`` for a brand-new thread, ``NotFound``
    when it belongs to another tenant."""
    owner = await thread_owner(store, thread_id)
    if owner is not None and not can_see(caller, owner):
        raise NotFound("thread", thread_id)
    return owner


def acting_tenant(caller: Caller, owner: Owner | None) -> str | None:
    """The tenant work is submitted for: the thread's (operators act for the owner), else the
    caller's for a new thread."""
    return owner.tenant if owner is not None else caller.tenant


class DispatchFilter:
    """Whether the caller may see a dispatch: operators see all, tenants the dispatches of
    their threads that were not submitted for another tenant (a cancel or a relayed
    message names none). Thread owners are looked up once per request."""

    def __init__(self, store: Store, caller: Caller) -> None:
        self.store = store
        self.caller = caller
        self._owners: dict[str, Owner | None] = {}

    async def visible(self, d: Dispatch) -> bool:
        if self.caller.operator:
            return True
        if tenant_of(d) not in (None, self.caller.tenant):
            return False
        if d.thread_id not in self._owners:
            self._owners[d.thread_id] = await thread_owner(self.store, d.thread_id)
        return can_see(self.caller, self._owners[d.thread_id])

    async def get(self, dispatch_id: str) -> Dispatch:
        d = await self.store.get_dispatch(dispatch_id)
        if d is None or not await self.visible(d):
            raise NotFound("dispatch", dispatch_id)
        return d


def tenant_scope(tenant: str) -> str:
    """The tag a tenant's keys are stored under: the first ``SCOPE_DIGITS`` hex digits of
    the SHA-256 of the tenant's name (fixed length, so ``<tag>.<key>`` is unambiguous
    whatever characters tenants and keys use)."""
    return hashlib.sha256(tenant.encode("utf-8")).hexdigest()[:SCOPE_DIGITS]


async def keyed_dispatch_id(
    store: Store, caller: Caller, key: str | None, *, prefix: str = "", field: str
) -> str | None:
    """The dispatch id a caller's idempotency key (or, with ``prefix="ext-"``, message id)
    stands for. A tenant's keys are its own namespace, so another tenant can neither probe
    them (409 against 202) nor take them first: they are stored as
    ``<prefix><tag>.<key>`` (``tenant_scope``). Operators and development mode (no tenant)
    keep ``<prefix><key>``, as before. A dispatch the same tenant stored under the unscoped
    id (before keys were scoped) is still the one a retry replays."""
    if key is None:
        return None
    if caller.tenant is None:
        return prefix + key
    unscoped = await store.get_dispatch(prefix + key)
    if unscoped is not None and tenant_of(unscoped) == caller.tenant:
        return prefix + key
    scoped = f"{tenant_scope(caller.tenant)}.{key}"
    if len(scoped) > MAX_KEY:
        raise InvalidInput(
            field,
            f"is {len(key)} characters long; a tenant's keys are at most "
            f"{MAX_KEY - SCOPE_DIGITS - 1} (they are stored with the tenant's tag)",
        )
    return prefix + scoped


def json_field(payload: Any, name: str) -> Any:
    return payload.get(name) if isinstance(payload, dict) else None


__all__ = [
    "CallerDep",
    "DispatchFilter",
    "OperatorDep",
    "Owner",
    "ServerState",
    "StateDep",
    "acting_tenant",
    "can_see",
    "get_caller",
    "get_state",
    "keyed_dispatch_id",
    "require_operator",
    "tenant_scope",
    "thread_owner",
    "visible_thread",
    "writable_thread",
]
