"""The rate limits of a model turn's calls (``wakeful.limits``): before each call, take one
request and the estimated tokens from every configured key's bucket in the store, sleeping
until the bucket's predicted refill (at most ``MAX_LIMIT_WAIT`` at a time, then asking again:
never spinning); after it, reconcile with the provider's reported usage; on a 429, block the
keys for the whole fleet until the provider's reset.

A run waiting here is inside ``NodeContext.waiting`` (its claim stays renewed by the renewal
task, independently) and is visible: a live ``waiting_for_limit`` event names the key and
the wait, and ``Metrics`` counts the waits per key."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from wakeful.errors import UnsupportedStore
from wakeful.limits import MAX_LIMIT_WAIT, RateLimit, check_limits
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
        """Wait for and take every key's request and estimated tokens; the estimate taken."""
        estimate = estimate_tokens(request)
        for limit in self.limits:
            waited = False
            while (wait := await self.store.take_limit(limit, 1, estimate)) > 0:
                if not waited:
                    waited = True
                    self._waiting(limit.key, wait)
                await self.sleep(min(wait, MAX_LIMIT_WAIT))
        return estimate

    async def settle(self, estimate: int, usage: Usage | None) -> None:
        """Pay or give back the difference between the usage and the estimate taken."""
        if usage is None:
            return  # the estimate stands
        used = usage.input_tokens + usage.output_tokens
        for limit in self.limits:
            if limit.tokens_per_minute is not None and used != estimate:
                await self.store.reconcile_limit(limit.key, used - estimate)

    async def refused(self, error: ProviderError) -> None:
        """A rate-limit refusal blocks every key until the provider's reset (its retry hint,
        else ``UNHINTED_BLOCK``), for every worker on the store."""
        if error.kind != "rate_limited":
            return
        seconds = UNHINTED_BLOCK if error.retry_after is None else error.retry_after
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
