"""Streaming overhead: deltas per second through the agent's model node from a provider
pacing 10,000 deltas/s, with stream checkpoints on the file and SQLite stores vs off.
Target: <= 5% overhead."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from benchmarks.common import Collector, Result, rounds_argument
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


LIMIT = 5.0
"""Percent: the target's ceiling on checkpoint overhead."""


def one_round(root: Path) -> dict[str, tuple[float, float]]:
    rows = {}
    for name, url in (("file", f"file://{root / 'fs'}"), ("sqlite", f"sqlite:///{root}/s.db")):
        off = asyncio.run(rate(url.replace("fs", "fs-off").replace("s.db", "off.db"), False))
        on = asyncio.run(rate(url, True))
        rows[name] = (off, on)
    return rows


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streaming")
    rounds_argument(parser)
    args = parser.parse_args(argv if argv is not None else [])
    offs: dict[str, list[float]] = {}
    ons: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            for name, (off, on) in one_round(Path(tmp)).items():
                offs.setdefault(name, []).append(off)
                ons.setdefault(name, []).append(on)
    print(
        f"{'store':<8} {'off /s':>10} {'on /s':>10} {'overhead':>9}   (provider pace {RATE:,.0f}/s,"
        f" {args.rounds} rounds, medians)"
    )
    out = Collector("streaming")
    for name in offs:
        # each round's on/off pair ran back to back: the overhead is judged per round
        overheads = [100 * (1 - on / off) for off, on in zip(offs[name], ons[name], strict=True)]
        off, on = statistics.median(offs[name]), statistics.median(ons[name])
        result = out.add(
            f"stream checkpoint overhead ({name})",
            overheads,
            "%",
            higher_is_better=False,
            anchor="limit",
            anchor_samples=LIMIT,
            target=1.0,
            note=f"deltas/s off {off:,.0f}, on {on:,.0f}",
        )
        print(f"{name:<8} {off:>10,.0f} {on:>10,.0f} {result.value:>8.1f}%")
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
