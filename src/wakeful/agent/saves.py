"""A turn's stream-checkpoint writes in the background, chained by callbacks.

One write in flight at a time; while it runs only the newest snapshot waits its turn, and
it goes out when the write in flight ends. A store with ``put_soon`` (both SQL stores,
``wakeful.store.streamputs``) answers a write with a future, so the chain costs no task at
all: a thousand streaming runs used to hold a saver task each (its coroutines, future and
context, about 2 KB a run) and pay two task steps per write. Any other store's ``put`` runs
as a task of its own per write, one at a time.

``drain()`` waits for the chain to end (what is in flight and the snapshot queued behind
it), bounded as ``BackgroundTask.stop`` is: after twice ``STOP_TIMEOUT`` it gives up on a
write that hangs, says so in a log line, and lets it finish on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from wakeful.background import STOP_TIMEOUT
from wakeful.records import StreamCheckpoint
from wakeful.store.contract import StreamCheckpointStore


class Saves:
    """The background writes of one turn's stream checkpoints (see the module docstring)."""

    __slots__ = ("_failed", "_flight", "_idle", "_log", "_name", "_next", "_saved", "_store")

    def __init__(
        self,
        store: StreamCheckpointStore,
        name: str,
        saved: Callable[[], None],
        failed: Callable[[BaseException], None],
        log: logging.Logger,
    ) -> None:
        self._store = store
        self._name = name
        self._saved = saved
        self._failed = failed
        self._log = log
        self._flight: asyncio.Future[Any] | None = None
        self._next: StreamCheckpoint | None = None
        self._idle: asyncio.Future[None] | None = None

    def save(self, snapshot: StreamCheckpoint) -> None:
        """Write ``snapshot`` now, or after the write in flight (replacing an older one
        waiting there)."""
        if self._flight is not None:
            self._next = snapshot
            return
        self._send(snapshot)

    def _send(self, snapshot: StreamCheckpoint) -> None:
        put_soon = getattr(self._store, "put_soon", None)
        try:
            if put_soon is not None:
                flight: asyncio.Future[Any] = put_soon(snapshot)
            else:
                flight = asyncio.get_running_loop().create_task(
                    self._store.put(snapshot), name=self._name
                )
        except Exception as exc:  # refused at once (invalid, the store closed)
            self._failed(exc)
            self._settled()
            return
        self._flight = flight
        flight.add_done_callback(self._landed)

    def _landed(self, flight: asyncio.Future[Any]) -> None:
        if flight is not self._flight:  # abandoned by a drain: no longer the turn's concern
            if not flight.cancelled():
                flight.exception()  # retrieved, so nothing reports it as never retrieved
            return
        self._flight = None
        if flight.cancelled():
            self._failed(asyncio.CancelledError("the stream checkpoint write was cancelled"))
        elif (exc := flight.exception()) is not None:
            self._failed(exc)
        else:
            self._saved()
        snapshot, self._next = self._next, None
        if snapshot is not None:
            self._send(snapshot)
            return
        self._settled()

    def _settled(self) -> None:
        if self._flight is None and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def drain(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Return once nothing is in flight or queued (bounded); True when it all ended."""
        if self._flight is None:
            self._next = None
            return True
        idle = self._idle = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait({idle}, timeout=2 * timeout)
        finally:
            self._idle = None
        if idle.done():
            return True
        flight, self._flight, self._next = self._flight, None, None
        if flight is not None:
            flight.cancel()
        self._log.warning(
            "background task %s did not stop within %.1f s of being asked to and was "
            "cancelled; abandoning it (it may still finish its current step)",
            self._name,
            2 * timeout,
        )
        return False


__all__ = ["Saves"]
