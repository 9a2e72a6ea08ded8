"""Rate limits shared by a fleet: a bucket per key kept in the store (issue 39).

A ``RateLimit`` names a provider's quota (``key``, e.g. ``"openai:gpt-4o"``) and its rates.
Configure it on a provider (``OpenAIChat(..., limits=[...])``) or on an ``Agent``
(``limits=``): each model call then takes one request and its estimated tokens from the
key's bucket before it is sent (waiting, without spinning, while the bucket is short), and
gives back or pays the difference with the provider's reported usage after. A 429 from the
provider blocks the key for every worker on the store until the provider's reset time.

The bucket is a token bucket per resource (requests, tokens): it refills continuously at the
per-minute rate and holds ``burst_seconds`` of it (at least one request), so over any window
of ``T`` seconds at most ``rate * T / 60 + burst`` is taken. A call larger than the whole
bucket is granted when the bucket is full and drives it negative: later calls wait until
the debt is refilled, so the long-run rate holds. See docs/flow-control.md.

The arithmetic here is the one every store applies (PostgreSQL in SQL, the others by
calling ``take``/``reconcile``/``block`` below inside their own atomic step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime

import msgspec

from wakeful.errors import InvalidInput
from wakeful.ids import check_id

EPSILON = 1e-6
"""A level this close below a need is enough (refill arithmetic in floating point)."""
MAX_LIMIT_WAIT = 5.0
"""A waiting call re-checks its bucket at least this often (seconds): the bucket is
shared, so a prediction can change (a 429 elsewhere, a changed limit)."""
WAITER_GRACE = 2.0
"""Seconds past its next expected check that a waiting run stays listed: a run that does
not ask again by then (its worker died, it was cancelled) is no longer shown as waiting."""
WAITER_PURGE = 60.0
"""Seconds past its next expected check after which a refused take deletes a waiter's
record (what a crashed worker left behind)."""


class RateLimit(msgspec.Struct, frozen=True, kw_only=True):
    """A quota shared by every worker on a store. ``key`` names the bucket (the same key in
    several providers or processes is one bucket); ``requests_per_minute`` and
    ``tokens_per_minute`` are the rates (``None``: not limited; with neither, the key still
    backs off together on the provider's 429s). ``burst_seconds``: how many seconds of the
    rates the bucket holds (at least one request)."""

    key: str
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    burst_seconds: float = 1.0

    def __post_init__(self) -> None:
        check_id("limit key", self.key)
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not (_finite(value) and value > 0):
                raise InvalidInput(name, f"must be a positive number or None, got {value!r}")
        if not (_finite(self.burst_seconds) and 0 < self.burst_seconds <= 3600):
            raise InvalidInput("burst_seconds", "must be a number of seconds in (0, 3600]")

    @property
    def request_capacity(self) -> float:
        """How many requests the full bucket holds (at least one)."""
        rpm = self.requests_per_minute
        return 0.0 if rpm is None else max(1.0, rpm * self.burst_seconds / 60.0)

    @property
    def token_capacity(self) -> float:
        tpm = self.tokens_per_minute
        return 0.0 if tpm is None else max(1.0, tpm * self.burst_seconds / 60.0)


class LimitWaiter(msgspec.Struct, frozen=True, kw_only=True):
    """The run a ``take_limit`` is for, so that a refused take can show it waiting."""

    run_id: str
    thread_id: str

    def __post_init__(self) -> None:
        check_id("run_id", self.run_id)
        check_id("thread_id", self.thread_id)


class LimitWait(msgspec.Struct, frozen=True, kw_only=True):
    """A run waiting for a key's bucket: since its first refused take, and ``until`` when it
    expects to ask again (the store's clock)."""

    run_id: str
    thread_id: str
    since: datetime
    until: datetime


class LimitBucket(msgspec.Struct, frozen=True, kw_only=True):
    """One key's bucket as the store holds it, read at ``at`` (the store's clock): the
    rates last configured, what is available now (``None`` for a rate not limited; negative
    while a call larger than the bucket is being paid off), the block of a 429 and the runs
    waiting for it (oldest first; a run is listed until ``WAITER_GRACE`` after the check it
    announced)."""

    key: str
    requests_per_minute: float | None
    tokens_per_minute: float | None
    requests_available: float | None
    tokens_available: float | None
    blocked_until: datetime | None
    at: datetime
    waiting: tuple[LimitWait, ...] = ()
    burst_seconds: float = 1.0
    """Seconds of the rates the full bucket holds (the last configured)."""

    @property
    def request_capacity(self) -> float | None:
        """Requests the full bucket holds (``None``: requests not limited)."""
        rpm = self.requests_per_minute
        return None if rpm is None else max(1.0, rpm * self.burst_seconds / 60.0)

    @property
    def token_capacity(self) -> float | None:
        tpm = self.tokens_per_minute
        return None if tpm is None else max(1.0, tpm * self.burst_seconds / 60.0)


def check_limits(limits: object) -> tuple[RateLimit, ...]:
    """``limits`` as a tuple of ``RateLimit`` with distinct keys (``None``: none)."""
    if limits is None:
        return ()
    if isinstance(limits, RateLimit):
        return (limits,)
    if not isinstance(limits, list | tuple):
        raise InvalidInput("limits", "must be a RateLimit or a list of them")
    found = tuple(limits)
    for item in found:
        if not isinstance(item, RateLimit):
            raise InvalidInput("limits", f"must hold RateLimit values, got {type(item).__name__}")
    keys = [item.key for item in found]
    if len(set(keys)) != len(keys):
        raise InvalidInput("limits", f"names a key twice: {keys}")
    return found


def check_take(requests: object, tokens: object) -> None:
    for name, value in (("requests", requests), ("tokens", tokens)):
        if type(value) is not int or not 0 <= value <= 10**9:
            raise InvalidInput(name, f"must be an integer in [0, 1e9], got {value!r}")


def check_wait(seconds: object) -> float:
    if not isinstance(seconds, int | float) or not (_finite(seconds) and 0 <= seconds <= 86400):
        raise InvalidInput("seconds", f"must be a number of seconds in [0, 86400], got {seconds!r}")
    return float(seconds)


def check_waiter(waiter: object) -> LimitWaiter | None:
    if waiter is not None and not isinstance(waiter, LimitWaiter):
        raise InvalidInput("waiter", f"must be a LimitWaiter or None, got {type(waiter).__name__}")
    return waiter


def check_delta(tokens: object) -> int:
    if type(tokens) is not int or abs(tokens) > 10**9:
        raise InvalidInput("tokens", f"must be an integer in [-1e9, 1e9], got {tokens!r}")
    return tokens


# ------------------------------------------------------------------------ the arithmetic


@dataclass(frozen=True, slots=True)
class BucketState:
    """A stored bucket: the levels as of ``stamp`` (seconds since the epoch, the store's
    clock); refilling starts at ``max(stamp, blocked)``, so a block drains it until then."""

    rpm: float | None
    tpm: float | None
    burst: float
    requests: float
    tokens: float
    stamp: float
    blocked: float = 0.0

    def limit(self, key: str) -> RateLimit:
        return RateLimit(
            key=key,
            requests_per_minute=self.rpm,
            tokens_per_minute=self.tpm,
            burst_seconds=self.burst,
        )

    def levels(self, now: float) -> tuple[float, float]:
        """The levels at ``now`` (refilled, capped); unchanged while blocked."""
        start = max(self.stamp, self.blocked)
        elapsed = max(0.0, now - start)
        rate_limit = self.limit("k")
        requests = tokens = 0.0
        if self.rpm is not None:
            requests = min(rate_limit.request_capacity, self.requests + elapsed * self.rpm / 60)
        if self.tpm is not None:
            tokens = min(rate_limit.token_capacity, self.tokens + elapsed * self.tpm / 60)
        return requests, tokens


def fresh(limit: RateLimit, now: float) -> BucketState:
    """A key's bucket before its first use: full, not blocked."""
    return BucketState(
        limit.requests_per_minute,
        limit.tokens_per_minute,
        limit.burst_seconds,
        limit.request_capacity,
        limit.token_capacity,
        now,
    )


def take(
    state: BucketState | None, limit: RateLimit, requests: int, tokens: int, now: float
) -> tuple[BucketState, float]:
    """Take ``requests`` and ``tokens`` at ``now``: the new state and ``0.0`` when granted;
    otherwise the state (refilled, nothing taken) and the seconds until the grant could
    happen (the block's end, or the refill of the larger shortfall). A need larger than the
    bucket waits for a full bucket and then takes it all and more (the level goes negative)."""
    state = fresh(limit, now) if state is None else _configured(state, limit)
    if now < state.blocked:
        return state, state.blocked - now
    level_r, level_t = state.levels(now)
    state = replace(state, requests=level_r, tokens=level_t, stamp=now)
    wait = 0.0
    if limit.requests_per_minute is not None:
        need = min(float(requests), limit.request_capacity)
        if level_r < need - EPSILON:
            wait = max(wait, (need - level_r) * 60 / limit.requests_per_minute)
    if limit.tokens_per_minute is not None:
        need = min(float(tokens), limit.token_capacity)
        if level_t < need - EPSILON:
            wait = max(wait, (need - level_t) * 60 / limit.tokens_per_minute)
    if wait > 0:
        return state, wait
    taken_r = level_r - requests if limit.requests_per_minute is not None else level_r
    taken_t = level_t - tokens if limit.tokens_per_minute is not None else level_t
    return replace(state, requests=taken_r, tokens=taken_t), 0.0


def settle_and_take(
    state: BucketState | None,
    limit: RateLimit,
    requests: int,
    tokens: int,
    settle: int,
    now: float,
) -> tuple[BucketState, float]:
    """``reconcile`` by ``settle`` (earlier calls' usage minus their estimates), then
    ``take``: what a take folding the process's pending reconciles does in one step. The
    settle stands whether or not the take is granted."""
    if state is not None and settle:
        state = reconcile(state, settle)
    return take(state, limit, requests, tokens, now)


def next_check(wait: float) -> float:
    """Seconds until a refused caller asks again (it sleeps at most ``MAX_LIMIT_WAIT``)."""
    return min(wait, MAX_LIMIT_WAIT)


def reconcile(state: BucketState, tokens: int) -> BucketState:
    """Pay ``tokens`` more (negative: give them back, up to a full bucket)."""
    if state.tpm is None:
        return state
    capacity = state.limit("k").token_capacity
    return replace(state, tokens=min(capacity, state.tokens - tokens))


def block(state: BucketState | None, seconds: float, now: float) -> BucketState:
    """Block the key until ``now + seconds`` (never earlier than a block already set) and
    drain it (a debt stays): after the block the bucket refills from empty, so the fleet
    resumes at the configured rate rather than in a burst."""
    until = max(now + seconds, state.blocked if state is not None else 0.0)
    if state is None:
        return BucketState(None, None, 1.0, 0.0, 0.0, now, until)
    return replace(
        state,
        requests=min(state.requests, 0.0),
        tokens=min(state.tokens, 0.0),
        stamp=now,
        blocked=until,
    )


def _configured(state: BucketState, limit: RateLimit) -> BucketState:
    """``state`` under ``limit``'s rates (the latest configuration wins); a resource that
    becomes limited starts full, unless a block drained the key."""
    drained = state.blocked > 0  # a block drains every resource, configured or not
    requests = state.requests if state.rpm is not None or drained else limit.request_capacity
    tokens = state.tokens if state.tpm is not None or drained else limit.token_capacity
    return replace(
        state,
        rpm=limit.requests_per_minute,
        tpm=limit.tokens_per_minute,
        burst=limit.burst_seconds,
        requests=requests,
        tokens=tokens,
    )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


__all__ = [
    "MAX_LIMIT_WAIT",
    "LimitBucket",
    "LimitWait",
    "LimitWaiter",
    "RateLimit",
    "check_limits",
]
