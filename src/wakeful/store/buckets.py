"""Rate-limit buckets held by the process (``RateLimitStore`` for the memory and file
stores): a dict of ``wakeful.limits.BucketState`` judged by the store's clock, and the runs
waiting for each key. Each method runs without awaiting, so it is atomic on the store's
event loop. ``listed`` and ``Waits`` are shared with the SQLite and PostgreSQL backends."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from wakeful import limits
from wakeful.errors import InvalidInput, StoreClosed
from wakeful.ids import check_id
from wakeful.limits import (
    WAITER_GRACE,
    WAITER_PURGE,
    BucketState,
    LimitBucket,
    LimitWait,
    LimitWaiter,
    RateLimit,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def seconds(at: datetime) -> float:
    return (at - EPOCH).total_seconds()


def moment(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


@dataclass(frozen=True, slots=True)
class Wait:
    """A waiter's record (seconds since the epoch, the store's clock)."""

    run_id: str
    thread_id: str
    since: float
    until: float


def waited(waits: dict[str, Wait], waiter: LimitWaiter, wait: float, now: float) -> None:
    """Record the refusal of ``waiter``'s take (``wait``: seconds until it could succeed)
    in one key's ``waits``, and forget waiters long gone; its first refusal stays ``since``."""
    until = now + limits.next_check(wait)
    before = waits.get(waiter.run_id)
    since = now if before is None else before.since
    waits[waiter.run_id] = Wait(waiter.run_id, waiter.thread_id, since, until)
    for run_id in [r for r, w in waits.items() if w.until < now - WAITER_PURGE]:
        del waits[run_id]


def listed(
    key: str, state: BucketState, now: float, waits: list[Wait] | None = None
) -> LimitBucket:
    """``state`` as ``limit_buckets`` reports it at ``now`` (shared by every backend), with
    the waiters still expected to ask again (``WAITER_GRACE``), oldest first."""
    level_r, level_t = state.levels(now)
    current = sorted(
        (w for w in waits or () if w.until + WAITER_GRACE > now),
        key=lambda w: (w.since, w.run_id),
    )
    return LimitBucket(
        key=key,
        requests_per_minute=state.rpm,
        tokens_per_minute=state.tpm,
        requests_available=None if state.rpm is None else level_r,
        tokens_available=None if state.tpm is None else level_t,
        blocked_until=moment(state.blocked) if state.blocked > now else None,
        at=moment(now),
        waiting=tuple(
            LimitWait(
                run_id=w.run_id, thread_id=w.thread_id, since=moment(w.since), until=moment(w.until)
            )
            for w in current
        ),
        burst_seconds=state.burst,
    )


def check_take_call(limit: object, requests: object, tokens: object, settle: object,
                    waiter: object) -> None:  # fmt: skip
    """Validate ``take_limit``'s arguments (every backend)."""
    if not isinstance(limit, RateLimit):
        raise InvalidInput("limit", f"must be a RateLimit, got {type(limit).__name__}")
    limits.check_take(requests, tokens)
    limits.check_delta(settle)
    limits.check_waiter(waiter)


class ProcessBuckets:
    """Mixin: ``now()`` is the store's clock, ``_closed`` its state."""

    _closed: bool

    if TYPE_CHECKING:

        def now(self) -> datetime: ...

    @property
    def _buckets(self) -> dict[str, BucketState]:
        found: dict[str, BucketState] | None = self.__dict__.get("_bucket_states")
        if found is None:
            found = self.__dict__["_bucket_states"] = {}
        return found

    @property
    def _waits(self) -> dict[str, dict[str, Wait]]:
        found: dict[str, dict[str, Wait]] | None = self.__dict__.get("_bucket_waits")
        if found is None:
            found = self.__dict__["_bucket_waits"] = {}
        return found

    def _bucket_now(self) -> float:
        if self._closed:
            raise StoreClosed()
        return seconds(self.now())

    async def take_limit(
        self,
        limit: RateLimit,
        requests: int,
        tokens: int,
        settle: int = 0,
        waiter: LimitWaiter | None = None,
    ) -> float:
        check_take_call(limit, requests, tokens, settle, waiter)
        now = self._bucket_now()
        before = self._buckets.get(limit.key)
        state, wait = limits.settle_and_take(before, limit, requests, tokens, settle, now)
        self._buckets[limit.key] = state
        if waiter is not None:
            if wait > 0:
                waited(self._waits.setdefault(limit.key, {}), waiter, wait, now)
            elif limit.key in self._waits:
                self._waits[limit.key].pop(waiter.run_id, None)
        return wait

    async def reconcile_limit(self, key: str, tokens: int) -> None:
        check_id("limit key", key)
        limits.check_delta(tokens)
        self._bucket_now()
        state = self._buckets.get(key)
        if state is not None:
            self._buckets[key] = limits.reconcile(state, tokens)

    async def block_limit(self, key: str, seconds: float) -> None:
        check_id("limit key", key)
        wait = limits.check_wait(seconds)
        now = self._bucket_now()
        self._buckets[key] = limits.block(self._buckets.get(key), wait, now)

    async def limit_buckets(self) -> list[LimitBucket]:
        now = self._bucket_now()
        return [
            listed(key, self._buckets[key], now, list(self._waits.get(key, {}).values()))
            for key in sorted(self._buckets)
        ]
