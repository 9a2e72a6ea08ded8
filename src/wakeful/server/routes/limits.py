"""``GET /v1/limits``: the flow control the fleet shares, as it stands now (issue 39 item 5).

``rate_limits``: every rate-limit key's bucket (docs/flow-control.md): its rates and
capacity, what it holds now, the end of a provider's block and the runs waiting for it. Any
authenticated caller sees the keys (they are the fleet's configuration, like the workers);
the waiting runs are tenant data: a tenant sees those on its own threads, an operator all.
``concurrency``: the concurrency keys in use, from the store's concurrency-key listing
(always present; empty until that listing exists)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from wakeful.fleet.tokens import Caller
from wakeful.limits import LimitBucket
from wakeful.server.access import CallerDep, StateDep, can_see, thread_owner
from wakeful.store.contract import ConcurrencyStore, RateLimitStore, Store

router = APIRouter(prefix="/v1", tags=["limits"])


class LimitWaitView(BaseModel):
    run_id: str
    thread_id: str
    since: datetime = Field(description="The run's first refused take of this key.")
    until: datetime = Field(description="When the run asks the bucket again.")


class RateLimitView(BaseModel):
    key: str
    requests_per_minute: float | None = Field(description="null: requests not limited.")
    tokens_per_minute: float | None = Field(description="null: tokens not limited.")
    request_capacity: float | None = Field(description="Requests the full bucket holds.")
    token_capacity: float | None = Field(description="Tokens the full bucket holds.")
    requests_available: float | None = Field(
        description="Requests the bucket holds now (negative: a debt being refilled)."
    )
    tokens_available: float | None = Field(
        description="Tokens the bucket holds now (negative: a debt being refilled)."
    )
    blocked_until: datetime | None = Field(
        description="The end of a provider's 429 block (null: not blocked)."
    )
    waiting: list[LimitWaitView] = Field(
        description="Runs waiting for the bucket, oldest first (a tenant: its own only)."
    )
    at: datetime = Field(description="When the store read the bucket (its clock).")


class ConcurrencyView(BaseModel):
    key: str
    limit: int
    admitted: int
    waiting: int


class LimitsView(BaseModel):
    rate_limits: list[RateLimitView]
    concurrency: list[ConcurrencyView] = Field(
        default_factory=list,
        description="Each concurrency key in use: its limit, how many of its runs are "
        "admitted (pending or leased) and how many wait (waiting_key).",
    )


async def _visible(store: Store, caller: Caller, bucket: LimitBucket) -> list[LimitWaitView]:
    owners: dict[str, bool] = {}
    shown = []
    for wait in bucket.waiting:
        if not caller.operator:
            if wait.thread_id not in owners:
                owner = await thread_owner(store, wait.thread_id)
                owners[wait.thread_id] = can_see(caller, owner)
            if not owners[wait.thread_id]:
                continue
        shown.append(LimitWaitView.model_validate(wait, from_attributes=True))
    return shown


@router.get("/limits")
async def list_limits(state: StateDep, caller: CallerDep) -> LimitsView:
    """The rate-limit buckets (key, rates, capacity, available, blocked until, the runs
    waiting) and the concurrency keys' use; a tenant sees only its own waiting runs."""
    store = state.store
    buckets = await store.limit_buckets() if isinstance(store, RateLimitStore) else []
    keys = await store.concurrency_keys() if isinstance(store, ConcurrencyStore) else []
    return LimitsView(
        concurrency=[
            ConcurrencyView(key=k.key, limit=k.limit, admitted=k.admitted, waiting=k.waiting)
            for k in keys
        ],
        rate_limits=[
            RateLimitView(
                key=b.key,
                requests_per_minute=b.requests_per_minute,
                tokens_per_minute=b.tokens_per_minute,
                request_capacity=b.request_capacity,
                token_capacity=b.token_capacity,
                requests_available=b.requests_available,
                tokens_available=b.tokens_available,
                blocked_until=b.blocked_until,
                waiting=await _visible(store, caller, b),
                at=b.at,
            )
            for b in buckets
        ],
    )
