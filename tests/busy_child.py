"""A worker process for the busy-thread fleet test: ``python -m tests.busy_child URL
SERVER_URL WORKER_ID DIR``. It serves the agent ``writer`` (streaming from the loopback
OpenAI-compatible server at SERVER_URL, a stream checkpoint after every delta) with a short
claim (ttl 2 s, renewed every 0.5 s). DIR/WORKER_ID.up says it runs; on SIGTERM it stops
gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from tests.stream_child import writer
from wakeful import open_store
from wakeful.fleet import Registry, Worker
from wakeful.runtime import ClaimPolicy


async def main(url: str, server_url: str, worker_id: str, directory: Path) -> None:
    store = await open_store(url)
    worker = Worker(
        store,
        Registry().add("writer", writer(server_url)),
        concurrency=2,
        claims=ClaimPolicy(ttl=2, renew_every=0.5),
        worker_id=worker_id,
        poll_interval=0.05,
        retry_backoff=0.05,
        relay=False,
    )
    loop = asyncio.get_running_loop()
    stopping = loop.create_task(asyncio.Event().wait())
    loop.add_signal_handler(signal.SIGTERM, stopping.cancel)
    running = loop.create_task(worker.run())
    (directory / f"{worker_id}.up").write_text("up")
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    await worker.stop(grace=1)
    await running
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
