"""Streaming overhead: deltas per second through the agent's model node from a provider
pacing 10,000 deltas/s, with stream checkpoints on the file and SQLite stores vs off.
Target: <= 5% overhead."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from wakeful import open_store
from wakeful.agent import Agent, StreamPolicy
from wakeful.providers.base import ModelRequest, StreamEnd, StreamItem, TextDelta, Usage
from wakeful.runtime import ClaimPolicy, Runtime

DELTAS = 20_000
RATE = 10_000.0


class Paced:
    """Yields ``DELTAS`` text deltas at ``RATE`` per second on average."""

    model = "paced"

    async def _stream(self) -> AsyncIterator[StreamItem]:
        start = time.perf_counter()
        for i in range(DELTAS):
            due = start + i / RATE
            ahead = due - time.perf_counter()
            if ahead > 0.001:
                await asyncio.sleep(ahead)
            yield TextDelta("tok ")
        yield StreamEnd("end_turn", Usage(1, DELTAS))

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._stream()


async def rate(url: str, checkpoints: bool) -> float:
    async with open_store(url) as store:
        policy = StreamPolicy(checkpoints=checkpoints)
        agent = Agent("bench", Paced(), stream_policy=policy)
        runtime = Runtime(store, ClaimPolicy(ttl=60, renew_every=20))
        start = time.perf_counter()
        reply = await agent.run(runtime, "t", "go")
        elapsed = time.perf_counter() - start
        assert reply.text is not None and len(reply.text) == 4 * DELTAS
        return DELTAS / elapsed


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = []
        for name, url in (("file", f"file://{root / 'fs'}"), ("sqlite", f"sqlite:///{root}/s.db")):
            off = asyncio.run(rate(url.replace("fs", "fs-off").replace("s.db", "off.db"), False))
            on = asyncio.run(rate(url, True))
            rows.append((name, off, on))
    print(
        f"{'store':<8} {'off /s':>10} {'on /s':>10} {'overhead':>9}   (provider pace {RATE:,.0f}/s)"
    )
    for name, off, on in rows:
        print(f"{name:<8} {off:>10,.0f} {on:>10,.0f} {100 * (1 - on / off):>8.1f}%")


if __name__ == "__main__":
    main()
