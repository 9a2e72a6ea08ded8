"""Wake signals: hints that new work may be waiting.

A wake is never needed for correctness: a worker still polls the queue at a floor interval,
so a lost wake only adds latency and a duplicated one only causes another (empty) drain."""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable


@runtime_checkable
class Wake(Protocol):
    async def notify(self) -> None:
        """Tell waiting workers (here or elsewhere) that work may be available."""
        ...

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification; True if one arrived."""
        ...

    async def close(self) -> None: ...


class LocalWake:
    """Wakes workers in this process (one event loop)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    async def notify(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                return False
        self._event.clear()
        return True

    async def close(self) -> None:
        self._event.set()


class NoWake:
    """Polling only."""

    async def notify(self) -> None:
        return None

    async def wait(self, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    async def close(self) -> None:
        return None
