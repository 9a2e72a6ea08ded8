"""Claim gathering: while the queue has a backlog, a worker whose slots free up one at a time
holds its first freed slot for a moment, so that one ``claim_next`` call leases several
(issue 22, decision 0022 "Third round").

A lease call costs the store a transaction and a fixed set of statements whatever its limit
(PostgreSQL, schema version 11: about 700 µs of server CPU for a call of 1, 160 µs per lease
in a call of 6), and at 10 runs per worker the slots of short runs free up a few at a time:
without gathering a PostgreSQL worker leased 3.4 dispatches per call in the no-op drain.

The contract: the hold only happens after a call that leased all it asked for (the queue
had more), only while runs are in flight, only until half of the slots are free, and never
longer than ``window`` seconds; a call that leased fewer than asked ends the backlog, so an
idle worker claims new work as soon as it is woken, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Waiter(Protocol):
    async def wait(self, timeout: float) -> bool: ...


CLAIM_BATCH = 1000
"""Dispatches asked for per ``claim_next`` call at most (SQLite and PostgreSQL take no more):
a larger concurrency fills up over several calls."""


@dataclass
class ClaimGather:
    """``window``: the longest a freed slot waits for others (seconds; 0 turns it off)."""

    window: float
    concurrency: int
    stopping: asyncio.Event
    backlog: bool = False
    """The last claim call leased as many dispatches as it asked for."""

    def __post_init__(self) -> None:
        if not self.window >= 0:
            raise ValueError("claim_gather must be a number of seconds, 0 or more")

    @property
    def enough(self) -> int:
        """Free slots worth a call of their own: half of them (at least one)."""
        return max(1, self.concurrency // 2)

    def claimed(self, asked: int, leased: int) -> None:
        """Record a claim call's result (``asked`` 0: no call was made)."""
        if asked > 0:
            self.backlog = leased >= asked

    async def hold(self, free: Callable[[], int], waiter: Waiter) -> int:
        """The slots to claim for (``free()``, at most ``CLAIM_BATCH``; 0 once the worker
        stops: no claim after a stop), once a call is due:
        at once unless there is a backlog and fewer than ``enough`` slots are free with runs
        in flight; else once enough are, the worker stops or ``window`` seconds passed.
        ``waiter`` returns early when a slot frees up (the worker nudges it)."""
        if self.window > 0 and self.backlog:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.window
            while not self.stopping.is_set() and 0 < free() < self.enough:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await waiter.wait(remaining)
        return 0 if self.stopping.is_set() else min(free(), CLAIM_BATCH)
