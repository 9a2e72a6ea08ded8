"""Rate-limit buckets held by the process (``RateLimitStore`` for the memory and file
stores): a dict of ``wakeful.limits.BucketState`` judged by the store's clock. Each method
runs without awaiting, so it is atomic on the store's event loop."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from wakeful import limits
from wakeful.errors import InvalidInput, StoreClosed
from wakeful.ids import check_id
from wakeful.limits import BucketState, LimitBucket, RateLimit

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def seconds(at: datetime) -> float:
    return (at - EPOCH).total_seconds()


def moment(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def listed(key: str, state: BucketState, now: float) -> LimitBucket:
    """``state`` as ``limit_buckets`` reports it at ``now`` (shared by every backend)."""
    level_r, level_t = state.levels(now)
    return LimitBucket(
        key=key,
        requests_per_minute=state.rpm,
        tokens_per_minute=state.tpm,
        requests_available=None if state.rpm is None else level_r,
        tokens_available=None if state.tpm is None else level_t,
        blocked_until=moment(state.blocked) if state.blocked > now else None,
        at=moment(now),
    )


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

    def _bucket_now(self) -> float:
        if self._closed:
            raise StoreClosed()
        return seconds(self.now())

    async def take_limit(self, limit: RateLimit, requests: int, tokens: int) -> float:
        if not isinstance(limit, RateLimit):
            raise InvalidInput("limit", f"must be a RateLimit, got {type(limit).__name__}")
        limits.check_take(requests, tokens)
        now = self._bucket_now()
        state, wait = limits.take(self._buckets.get(limit.key), limit, requests, tokens, now)
        self._buckets[limit.key] = state
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
        return [listed(key, self._buckets[key], now) for key in sorted(self._buckets)]
