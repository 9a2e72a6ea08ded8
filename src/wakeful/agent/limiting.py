"""The rate limits of a model turn's calls (``wakeful.limits``): before each call, take one
request and the estimated tokens from every configured key's bucket in the store, sleeping
until the bucket's predicted refill (at most ``MAX_LIMIT_WAIT`` at a time, then asking again:
never spinning); after it, reconcile with the provider's reported usage; on a 429, block the
keys for the whole fleet until the provider's reset.

The reconcile is not a store call of its own: the difference is added to the process's
pending settle for the key (one ledger per store handle) and paid by the next take of the key
from this process, in the same statement (``take_limit(..., settle=)``): one store round trip
per model call. A credit for an overestimate thus returns to the fleet at the process's next
call on the key; a store that cannot hold a ledger (not weak-referenceable) reconciles at
once.

A run waiting here is inside ``NodeContext.waiting`` (its claim stays renewed by the renewal
task, independently) and is visible: a live ``waiting_for_limit`` event names the key and
the wait, and ``Metrics`` counts the waits per key."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from wakeful.errors import StaleClaim, UnsupportedStore
from wakeful.limits import MAX_LIMIT_WAIT, LimitWaiter, RateLimit, check_limits
from wakeful.providers.base import ModelRequest, ProviderError, Usage
from wakeful.store.contract import RateLimitStore

if TYPE_CHECKING:
    from wakeful.metrics import Metrics

log = logging.getLogger("wakeful.agent")

Sleep = Callable[[float], Awaitable[None]]
Live = Callable[[str, Any], None]

UNHINTED_BLOCK = 1.0
"""Seconds a 429 without any reset hint blocks its keys."""
CHARS_PER_TOKEN = 4
"""The estimate's ratio: about four characters a token for English text and JSON."""
CLAIM_CHECK_EVERY = 2.0
"""Seconds of waiting between two checks that the run still holds its claim: a run
cancelled or taken over while it waits stops waiting (``StaleClaim``) instead of waiting
out the bucket; it would stop at its next commit anyway, later."""
MAX_BLOCK = 3600.0
"""The longest block a successful answer's rate-limit headers set (a daily quota's reset
hours away is the provider's to enforce; the bucket need not hold the fleet that long)."""
MAX_SETTLE = 10**9
"""The most a pending settle holds (``take_limit``'s bound); beyond it, reconciled at once."""

_LEDGERS: weakref.WeakKeyDictionary[object, dict[str, int]] = weakref.WeakKeyDictionary()
"""Per store handle: each key's tokens to pay (negative: to give back) at the next take."""


def ledger_of(store: object) -> dict[str, int] | None:
    """The pending settles of ``store``'s keys in this process (``None``: the store cannot
    hold one; reconcile at once)."""
    try:
        return _LEDGERS.setdefault(store, {})
    except TypeError:
        return None


def estimate_tokens(request: ModelRequest) -> int:
    """What a call may cost before it is sent: its text (messages, tool calls, system, tool
    schemas) at ``CHARS_PER_TOKEN``, plus ``max_tokens`` (providers count the reserved
    output against the token limit at admission, as OpenAI does)."""
    chars = len(request.system or "")
    for message in request.messages:
        chars += len(message.content or "")
        for call in message.tool_calls or ():
            chars += len(str(call.get("arguments", ""))) + len(str(call.get("name", "")))
    if request.tools:
        chars += len(msgspec.json.encode([msgspec.to_builtins(t) for t in request.tools]))
    return chars // CHARS_PER_TOKEN + 1 + request.max_tokens


def limits_of(*sources: object) -> tuple[RateLimit, ...]:
    """The limits configured on each source (a provider's or an agent's ``limits``), the
    first configuration of a key winning."""
    found: dict[str, RateLimit] = {}
    for source in sources:
        for limit in check_limits(getattr(source, "limits", None)):
            found.setdefault(limit.key, limit)
    return tuple(found.values())


@dataclass(slots=True)
class CallLimits:
    """Gates the calls of one turn (see the module docstring)."""

    limits: Sequence[RateLimit]
    store: RateLimitStore
    sleep: Sleep
    live: Live | None = None
    metrics: Metrics | None = None
    run_id: str = ""
    thread_id: str = ""
    fencing_token: int | None = None
    """The run's claim token: while waiting, the run checks it still holds the claim."""
    _ledger: dict[str, int] | None = field(default=None, init=False)
    _waiter: LimitWaiter | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._ledger = ledger_of(self.store)
        if self.run_id and self.thread_id:
            self._waiter = LimitWaiter(run_id=self.run_id, thread_id=self.thread_id)

    @classmethod
    def for_store(
        cls, limits: Sequence[RateLimit], store: object, sleep: Sleep, **options: Any
    ) -> CallLimits | None:
        """``None`` without limits; ``UnsupportedStore`` if the store keeps no buckets."""
        if not limits:
            return None
        if not isinstance(store, RateLimitStore):
            raise UnsupportedStore(
                type(store).__name__,
                "rate limits need a store that keeps rate-limit buckets (memory, file, "
                "sqlite, postgresql); remove the limits or use one of those stores",
            )
        return cls(limits, store, sleep, **options)

    async def acquire(self, request: ModelRequest) -> int:
        """Wait for and take every key's request and estimated tokens (paying the key's
        pending settle in the same step); the estimate taken. While a take is refused the
        run is recorded as waiting for the key (``limit_buckets`` lists it)."""
        estimate = estimate_tokens(request)
        ledger = self._ledger
        for limit in self.limits:
            waited = False
            unchecked = 0.0
            while True:
                settle = 0
                if ledger is not None and limit.tokens_per_minute is not None:
                    settle = ledger.get(limit.key, 0)
                wait = await self.store.take_limit(
                    limit, 1, estimate, settle=settle, waiter=self._waiter
                )
                if settle:
                    assert ledger is not None
                    left = ledger.get(limit.key, 0) - settle  # calls may have added meanwhile
                    if left:
                        ledger[limit.key] = left
                    else:
                        ledger.pop(limit.key, None)
                if wait <= 0:
                    break
                if not waited:
                    waited = True
                    self._waiting(limit.key, wait)
                await self.sleep(min(wait, MAX_LIMIT_WAIT))
                unchecked += min(wait, MAX_LIMIT_WAIT)
                if unchecked >= CLAIM_CHECK_EVERY:
                    unchecked = 0.0
                    await self._check_claim()
        return estimate

    async def _check_claim(self) -> None:
        """``StaleClaim`` when the run's claim is no longer the thread's (cancelled, taken
        over); nothing without a token or a store that reads threads."""
        read = getattr(self.store, "read", None)
        if self.fencing_token is None or not self.thread_id or read is None:
            return
        snap = await read(self.thread_id)
        current = None if snap is None or snap.claim is None else snap.claim.token
        if current != self.fencing_token:
            raise StaleClaim(self.thread_id, self.fencing_token, current)

    async def settle(
        self, estimate: int, usage: Usage | None, exhausted: float | None = None
    ) -> None:
        """Pay or give back the difference between the usage and the estimate taken: added
        to the key's pending settle, which the process's next take of the key pays.
        ``exhausted``: the provider's rate-limit headers said this call used a limit up
        (``StreamEnd.limit_reset``): every key is blocked until its reset, for the fleet,
        as a 429 would have done for the next call."""
        if exhausted is not None and exhausted > 0:
            await self._block(min(exhausted, MAX_BLOCK))
        if usage is None:
            return  # the estimate stands
        delta = usage.input_tokens + usage.output_tokens - estimate
        if delta == 0:
            return
        ledger = self._ledger
        for limit in self.limits:
            if limit.tokens_per_minute is None:
                continue
            pending = delta if ledger is None else ledger.get(limit.key, 0) + delta
            if ledger is None or abs(pending) > MAX_SETTLE:
                if ledger is not None:
                    ledger.pop(limit.key, None)
                await self.store.reconcile_limit(
                    limit.key, max(-MAX_SETTLE, min(MAX_SETTLE, pending))
                )
            else:
                ledger[limit.key] = pending

    async def refused(self, error: ProviderError) -> None:
        """A rate-limit refusal blocks every key until the provider's reset (its retry hint,
        else ``UNHINTED_BLOCK``), for every worker on the store."""
        if error.kind != "rate_limited":
            return
        seconds = UNHINTED_BLOCK if error.retry_after is None else error.retry_after
        await self._block(seconds)

    async def _block(self, seconds: float) -> None:
        for limit in self.limits:
            await self.store.block_limit(limit.key, seconds)
        if self.metrics is not None:
            for limit in self.limits:
                self.metrics.limit_blocks.inc(key=limit.key)

    def _waiting(self, key: str, wait: float) -> None:
        log.info(
            "run %s: waiting %.2f s for rate limit %r",
            self.run_id,
            wait,
            key,
            extra={"run_id": self.run_id, "limit_key": key},
        )
        if self.live is not None:
            self.live(
                "waiting_for_limit", {"status": "waiting_for_limit", "key": key, "seconds": wait}
            )
        if self.metrics is not None:
            self.metrics.limit_waits.inc(key=key)
