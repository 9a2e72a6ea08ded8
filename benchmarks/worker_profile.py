"""One worker process's own CPU per no-op dispatch on PostgreSQL, optionally profiled.

Run ``python -m benchmarks.worker_profile [--n 1000] [--rounds 3] [--profile FILE]
[--dsn URL]``. Each round submits ``--n`` dispatches of the dispatch benchmark's no-op graph
to a fresh database (untimed), then one ``Worker(concurrency=10, wake=LocalWake())`` in this
process drains them; printed: process CPU (``time.process_time``) per dispatch over the
drain, dispatches/s and ``claim_next`` calls per dispatch. With ``--profile``, the last
round runs under ``cProfile`` timed by process CPU (not wall time: a wall-clock profile
charges the waits for the server to whatever call was running) and its stats are written
to FILE (read them with ``pstats``, sorted by ``tottime``). Decision 0022, "Worker CPU".

To compare two versions of the source in the same run, interleave rounds with
``PYTHONPATH=<other checkout>/src:.`` set for one of them (a path on ``PYTHONPATH`` comes
before the editable install)."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import time

from benchmarks.common import DEFAULT_DSN, Database
from benchmarks.dispatch import _drained, _noop_registry, submit_all, verify_wakeful
from wakeful import open_store
from wakeful.fleet import LocalWake, Worker
from wakeful.runtime import ClaimPolicy


async def drain(url: str, n: int, profile: cProfile.Profile | None) -> tuple[float, float, float]:
    """(process CPU µs per dispatch, dispatches/s, claim calls per dispatch)."""
    counter = [0]
    async with open_store(url) as store:
        worker = Worker(
            store,
            _noop_registry(counter),
            concurrency=10,
            claims=ClaimPolicy(ttl=30, renew_every=10),
            wake=LocalWake(),
            poll_interval=0.5,
            relay=False,
        )
        cpu, wall = time.process_time(), time.monotonic()
        if profile is not None:
            profile.enable()
        running = asyncio.create_task(worker.run())
        await _drained(worker)
        await worker.stop(grace=5)
        await running
        if profile is not None:
            profile.disable()
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    if counter[0] != n:
        raise RuntimeError(f"{counter[0]} executions of {n} dispatches")
    return cpu / n * 1e6, n / wall, worker.stats.polls / n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="write the last round's cProfile stats here")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server (admin DSN)")
    args = parser.parse_args(argv)
    db = Database(args.dsn, f"wakeful_bench_worker_{os.getpid()}")
    for i in range(args.rounds):
        last = i == args.rounds - 1
        profile = cProfile.Profile(time.process_time) if args.profile and last else None
        db.create()
        try:
            asyncio.run(submit_all(db.dsn, args.n))
            cpu, rate, claims = asyncio.run(drain(db.dsn, args.n, profile))
            asyncio.run(verify_wakeful(db.dsn, args.n))
        finally:
            db.drop()
        note = " (profiled)" if profile is not None else ""
        print(f"round {i}: {cpu:,.0f} µs of CPU per dispatch, {rate:,.0f} dispatches/s, "
              f"{claims:.2f} claim calls per dispatch{note}", flush=True)  # fmt: skip
        if profile is not None:
            profile.dump_stats(args.profile)


if __name__ == "__main__":
    main()
