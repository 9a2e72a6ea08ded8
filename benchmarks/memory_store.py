"""Memory store: commits/s and claim+commit+release cycles/s (the reference backend's
overhead, a ceiling for the others)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from benchmarks.common import Collector, Result, rounds_argument
from wakeful import Checkpoint, Commit, EventDraft, ManualClock
from wakeful.store.memory import MemoryStore

PAYLOAD = {"messages": ["x" * 200] * 5, "step": 0}


async def commits(n: int) -> float:
    clock = ManualClock()
    store = MemoryStore(clock)
    claim = await store.claim("t", "bench", 30)
    parent = None
    start = time.perf_counter()
    for i in range(n):
        cp = Checkpoint(
            id=f"c{i}",
            parent=parent,
            run_id="r",
            status="running",
            state=PAYLOAD,
            created_at=clock.now(),
        )
        await store.commit(
            "t", Commit(token=claim.token, checkpoint=cp, events=(EventDraft(type="step"),))
        )
        parent = cp.id
    return n / (time.perf_counter() - start)


async def cycles(n: int) -> float:
    clock = ManualClock()
    store = MemoryStore(clock)
    start = time.perf_counter()
    for i in range(n):
        claim = await store.claim(f"t{i % 100}", "bench", 30)
        await store.commit(f"t{i % 100}", Commit(token=claim.token, events=(EventDraft(type="e"),)))
        await store.release(f"t{i % 100}", claim.token)
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_store")
    parser.add_argument("--n", type=int, default=20_000, help="operations per measurement")
    rounds_argument(parser)
    args = parser.parse_args(argv if argv is not None else [])
    commit_rates, cycle_rates = [], []
    for _ in range(args.rounds):
        commit_rates.append(asyncio.run(commits(args.n)))
        cycle_rates.append(asyncio.run(cycles(args.n)))
    out = Collector("memory_store")
    c = out.add("commit (checkpoint + event)", commit_rates, "/s")
    k = out.add("claim + commit + release", cycle_rates, "/s")
    print(f"memory store, {args.rounds} rounds of {args.n} (medians)")
    print(f"{'memory commit (checkpoint + event)':<45} {c.value:>10,.0f} /s")
    print(f"{'memory claim+commit+release':<45} {k.value:>10,.0f} /s")
    return out.results


if __name__ == "__main__":
    main(sys.argv[1:])
