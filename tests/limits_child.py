"""A fleet worker process for the rate-limit tests:
``python -m tests.limits_child URL WORKER_ID BASE_URL RPM BURST_SECONDS``.

Registers one target, ``chat``: an agent on ``OpenAIChat(base_url=BASE_URL)`` whose every
model call takes from the rate limit ``tests:chat`` (``RPM`` requests a minute, a bucket of
``BURST_SECONDS``). Runs four dispatches at a time until killed; writes ``WORKER_ID.up`` in
the working directory once it runs."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from wakeful import open_store
from wakeful.agent import Agent
from wakeful.fleet import Registry, Worker
from wakeful.limits import RateLimit
from wakeful.providers import OpenAIChat
from wakeful.runtime import ClaimPolicy

KEY = "tests:chat"


async def main(url: str, worker_id: str, base_url: str, rpm: float, burst: float) -> None:
    limit = RateLimit(key=KEY, requests_per_minute=rpm, burst_seconds=burst)
    model = OpenAIChat("m", base_url=base_url, limits=[limit])
    store = await open_store(url)
    worker = Worker(
        store,
        Registry().add("chat", Agent("chat", model)),
        concurrency=4,
        claims=ClaimPolicy(ttl=5.0, renew_every=1.0),
        worker_id=worker_id,
        poll_interval=0.05,
        retry_backoff=0.05,
        relay=False,
    )
    running = asyncio.create_task(worker.run())
    await asyncio.to_thread(Path(f"{worker_id}.up").write_text, "up")
    await running


if __name__ == "__main__":
    url, worker_id, base_url, rpm, burst = sys.argv[1:6]
    asyncio.run(main(url, worker_id, base_url, float(rpm), float(burst)))
