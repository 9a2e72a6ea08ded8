"""The outbox relay and the sweeper, run by one process at a time per store: the one that
holds the claim on the well-known thread ``RELAY_THREAD``.

The election claim is short (``RELAY_TTL``) and renewed at every step, so a relay that dies
(SIGKILL, a lost host) stops blocking its successors within ``ttl`` seconds: delivery after
a relay crash is late by at most about ``ttl + interval`` plus the successor's own start.
The claim only elects; it does not fence deliveries (each is idempotent by message id), so
a claim that lapses under a slow step costs at most a second relay's duplicate effort."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from wakeful.background import StopSignal, pause
from wakeful.errors import InvalidInput, StaleClaim, ThreadBusy, WakefulError
from wakeful.fleet.wake import Wake
from wakeful.fleet.webhooks import prune_webhooks
from wakeful.records import Claim, RetentionPolicy
from wakeful.runtime.children import watch_spawns
from wakeful.runtime.claims import ClaimPolicy
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.fleet")

RELAY_THREAD = "wakeful.relay"

RELAY_TTL = 3.0
"""Seconds the relay's election claim lasts unless renewed (``RelayLoop(ttl=...)``,
``wakeful relay --ttl``). Renewals are one cheap write per step."""


class RelayLoop:
    """While elected: deliver staged outbox entries (waking workers when something was
    delivered) and, every ``sweep_every`` seconds, apply the retention policy (and delete
    the records of finished webhook deliveries as old as the settled dispatches it prunes:
    ``wakeful.fleet.webhooks.prune_webhooks``).

    ``ttl``: seconds of the election claim, by default the shorter of ``RELAY_TTL`` and
    ``claims.ttl``. A step runs every ``interval`` seconds, at most every ``ttl / 4``, and
    renews the claim; a long drain renews between its batches too."""

    def __init__(
        self,
        store: Store,
        holder: str,
        claims: ClaimPolicy,
        wake: Wake,
        retention: RetentionPolicy | None = None,
        interval: float = 0.5,
        sweep_every: float = 300.0,
        batch: int = 100,
        *,
        ttl: float | None = None,
    ) -> None:
        self.store = store
        self.holder = holder
        self.claims = claims
        self.wake = wake
        self.retention = retention
        self.ttl = min(RELAY_TTL, claims.ttl) if ttl is None else ttl
        if not self.ttl > 0:
            raise InvalidInput("ttl", f"the relay's claim ttl must be > 0 seconds, not {ttl}")
        self.interval = min(interval, self.ttl / 4)
        self.sweep_every = sweep_every
        self.batch = batch
        self.delivered = 0
        self._claim: Claim | None = None
        self._poke: asyncio.Event | None = None

    async def run(self, stop: StopSignal | asyncio.Event) -> None:
        """Until ``stop`` is set: each step ends before the flag is looked at again, and the
        waits between steps end as soon as it is set (never only by cancellation)."""
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()
        poke = self._poke = asyncio.Event()

        def nudge() -> None:  # from any thread: a spawn's commit may be another loop's
            loop.call_soon_threadsafe(poke.set)

        unwatch = watch_spawns(nudge)
        try:
            while not stop.is_set():
                if await self._elected() and not stop.is_set():
                    await self.drain()
                    if (
                        self.retention is not None
                        and loop.time() >= next_sweep
                        and not stop.is_set()
                    ):
                        report = await self.store.prune(self.retention)
                        log.info("retention: %s", report)
                        if (age := self.retention.settled_dispatch_max_age) is not None:
                            gone = await prune_webhooks(self.store, age)
                            log.info("retention: %d finished webhook deliveries", gone)
                        next_sweep = loop.time() + self.sweep_every
                if await self._rest(stop):
                    break
        finally:
            unwatch()
            if self._claim is not None:
                with contextlib.suppress(WakefulError):
                    await self.store.release(RELAY_THREAD, self._claim.token)

    async def _rest(self, stop: StopSignal | asyncio.Event) -> bool:
        """Wait ``interval`` seconds, or less if a run of this process committed spawns
        it waits for (``watch_spawns``); True when ``stop`` is set."""
        poke = self._poke
        if poke is not None and not poke.is_set():
            poked = asyncio.ensure_future(poke.wait())
            resting = asyncio.ensure_future(pause(stop, self.interval))
            try:
                await asyncio.wait({poked, resting}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                poked.cancel()
                resting.cancel()
        elif poke is None:
            return await pause(stop, self.interval)
        poke.clear()
        return stop.is_set()

    async def drain(self) -> int:
        """Deliver until the outbox is empty; returns how many entries were handled."""
        total = 0
        loop = asyncio.get_running_loop()
        renew_at = loop.time() + self.interval
        while True:
            if self._claim is not None and loop.time() >= renew_at:
                await self._elected()  # a long drain keeps its claim (or learns it lost it)
                renew_at = loop.time() + self.interval
            try:
                handled = await self.store.relay_outbox(self.batch)
            except WakefulError as exc:
                log.warning("relay failed, will retry: %s", exc)
                break
            total += handled
            if handled < self.batch:
                break
        if total:
            self.delivered += total
            await self.wake.notify()
        return total

    async def _elected(self) -> bool:
        try:
            if self._claim is None:
                self._claim = await self.store.claim(RELAY_THREAD, self.holder, self.ttl)
            else:
                self._claim = await self.store.renew(RELAY_THREAD, self._claim.token, self.ttl)
            return True
        except ThreadBusy:
            return False
        except StaleClaim:
            self._claim = None
            return False
        except WakefulError as exc:
            log.warning("relay election failed: %s", exc)
            return False
