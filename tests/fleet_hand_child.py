"""A worker whose agent calls a keyed tool through the remote hand.

``python -m tests.fleet_hand_child URL DIR HAND_URL MODE`` with MODE ``first`` (the model
asks for the tool; after the hand answered, the tool hangs so the test can kill the worker
before the result is committed) or ``replacement`` (the model then answers)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from wakeful import open_store
from wakeful.agent import Agent, ToolContext, tool
from wakeful.fleet import Registry, Worker
from wakeful.fleet.hand import RemoteHand
from wakeful.providers.scripted import Scripted, calls, reply
from wakeful.runtime import ClaimPolicy


def registry(directory: Path, hand_url: str, mode: str) -> Registry:
    hand = RemoteHand(hand_url, timeout=10)

    @tool(replay="keyed")
    async def count(tag: str, ctx: ToolContext) -> Any:
        """Record an effect, once per idempotency key."""
        result = await hand.call("count", {"tag": tag}, ctx=ctx)
        (directory / f"answered-{mode}").write_text(str(result))
        if mode == "first":
            await asyncio.Event().wait()  # killed here: the hand ran, nothing committed
        return result

    script = (
        [calls(("call-1", "count", {"tag": "charge"})), reply("unused")]
        if mode == "first"
        else [reply("Charged once.")]
    )
    return Registry().add("payer", Agent("payer", Scripted(script), tools=[count]))


async def main(url: str, directory: Path, hand_url: str, mode: str) -> None:
    store = await open_store(url)
    worker = Worker(
        store,
        registry(directory, hand_url, mode),
        concurrency=1,
        claims=ClaimPolicy(ttl=1.0, renew_every=0.25),
        worker_id=f"w-{mode}",
        poll_interval=0.05,
        relay=False,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
