"""One way to compute retry delays, for every place that waits before trying again.

``backoff_delay(n, initial, maximum)`` is the delay before the ``n``-th retry (1 for the
first): ``initial * factor**(n - 1)``, capped at ``maximum``, then multiplied by a random
factor in ``[1 - jitter, 1 + jitter]`` when ``jitter`` is given (so callers that fail
together do not retry together). Without jitter it is deterministic. Used by the agent's
stream recovery, the worker's dispatch retries, the remote hand's lookups, a graph node's
``RetryPolicy``, the PostgreSQL listener's reconnects and the HTTP client's stream
reconnects; each keeps its own documented parameters.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    retry: int,
    initial: float,
    maximum: float,
    *,
    factor: float = 2.0,
    jitter: float = 0.0,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds to wait before retry number ``retry`` (1-based; a value below 1 counts as
    1). ``uniform`` draws the jitter factor (tests pass a fixed one)."""
    if not 0.0 <= jitter <= 1.0:
        raise ValueError("jitter must be in [0, 1]")
    base = min(initial * factor ** (max(retry, 1) - 1), maximum)
    if jitter:
        base *= uniform(1.0 - jitter, 1.0 + jitter)
    return float(base)


__all__ = ["backoff_delay"]
