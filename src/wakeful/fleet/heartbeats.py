"""The worker's heartbeat: its registration's sign of life in the store's worker registry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from wakeful.background import StopSignal
from wakeful.errors import WakefulError, WorkerSuperseded
from wakeful.records import WorkerIdentity
from wakeful.store.contract import Store

log = logging.getLogger("wakeful.fleet")


async def beat(
    store: Store,
    identity: WorkerIdentity,
    interval: float,
    stopping: asyncio.Event,
    signal: StopSignal,
    superseded: Callable[[], None],
) -> None:
    """Heartbeat every ``interval`` seconds until ``stopping`` is set or ``signal`` fires.

    A newer registration of the same worker id (``WorkerSuperseded``) calls ``superseded``
    and ends the loop's usefulness: the caller stops; any other store error is logged and
    the next beat tries again."""
    while not stopping.is_set():
        if await signal.pause(interval) or stopping.is_set():
            return
        try:
            await store.heartbeat(identity)
        except WorkerSuperseded:
            log.error("worker %s was superseded by a newer registration", identity.worker_id)
            superseded()
        except WakefulError as exc:
            log.warning("heartbeat failed: %s", exc)
