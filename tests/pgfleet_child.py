"""A worker process over PostgreSQL for the PgBouncer and failover tests:
``python -m tests.pgfleet_child STORE_URL WAKE_URL WORKER_ID DIR``.

It serves one agent, ``ops``: the model (a stateless loopback stand-in: it asks for the tool
until the conversation holds the tool's result, then answers) calls ``charge``, a
``replay="never"`` tool that appends ``<thread id>`` to DIR/charges.txt (fsynced) and
returns. So DIR/charges.txt holds one line per execution of the tool, and a tool that ran
twice for one thread shows as two lines. The worker wakes through ``PostgresWake`` at
WAKE_URL (a direct URL: a transaction pooler cannot carry LISTEN), polls every 0.2 s, and
publishes its runs' model deltas on the live channel ``PostgresLive`` at WAKE_URL, and
takes part in the election of the outbox relay (``relay=True``).
SIGTERM stops it gracefully; it then prints its stats as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path

from wakeful import open_store
from wakeful.agent import Agent, ToolContext, tool
from wakeful.fleet import Registry, Worker
from wakeful.fleet.pglive import PostgresLive
from wakeful.fleet.pgwake import PostgresWake
from wakeful.providers.base import ModelRequest, StreamItem
from wakeful.providers.scripted import Scripted, calls, reply
from wakeful.runtime import ClaimPolicy

TTL = 2.0


class Stateless:
    """Asks for ``charge`` once per conversation, then answers: a function of the request
    alone, so any worker can play any turn of any run."""

    model = "stateless"

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        answered = any(m.role == "tool" for m in request.messages)
        turn = reply("Charged.") if answered else calls(("c-charge", "charge", {"cents": 100}))
        return Scripted.of(turn).stream(request)


def registry(directory: Path) -> Registry:
    @tool(replay="never")
    async def charge(cents: int, ctx: ToolContext) -> str:
        """Charge the customer: must never run twice."""
        with (directory / "charges.txt").open("a", encoding="utf-8") as f:
            f.write(ctx.thread_id + "\n")
            f.flush()
            os.fsync(f.fileno())
        return f"charged {cents}"

    agent = Agent("ops", Stateless(), "Charge once.", [charge])
    return Registry().add("ops", agent)


async def main(url: str, wake_url: str, worker_id: str, directory: Path) -> None:
    store = await open_store(url, pool_size=4, pool_timeout=5.0, wake_url=wake_url)
    wake = PostgresWake(wake_url)
    live = PostgresLive(wake_url)  # the runs' model deltas, for stream servers elsewhere
    worker = Worker(
        store,
        registry(directory),
        concurrency=4,
        claims=ClaimPolicy(ttl=TTL, renew_every=TTL / 4),
        wake=wake,
        worker_id=worker_id,
        poll_interval=0.2,
        retry_backoff=0.05,
        max_retry_backoff=0.5,
        relay=True,  # the outbox relay (elected among the workers) rides the failovers too
        live=live,
    )
    loop = asyncio.get_running_loop()
    stopping = loop.create_task(asyncio.Event().wait())
    loop.add_signal_handler(signal.SIGTERM, stopping.cancel)
    running = loop.create_task(worker.run())
    (directory / f"{worker_id}.up").write_text("up")
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    await worker.stop(grace=5)
    await running
    await wake.close()
    await live.close()
    await store.close()
    print(json.dumps(asdict(worker.stats)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
