"""Child for the cross-process stream recovery test: streams an agent turn from the local
OpenAI-compatible server; reports once a stream checkpoint holds partial output."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.runtime_support import mark_ready
from wakeful import open_store
from wakeful.agent import Agent, StreamPolicy
from wakeful.providers.openai import OpenAIChat
from wakeful.runtime import ClaimPolicy, Runtime


def writer(server_url: str) -> Agent:
    model = OpenAIChat("gpt-test", base_url=server_url, api_key="test-key")
    policy = StreamPolicy(checkpoint_every_deltas=1, checkpoint_min_interval=0, idle_timeout=30)
    return Agent("writer", model, "Tell stories.", stream_policy=policy)


async def main(url: str, server_url: str, ready: Path) -> None:
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    handle = await writer(server_url).start(runtime, "t", "Tell me a story")
    while True:
        saved = await store.stream_checkpoints.get(handle.run_id)
        if saved is not None and saved.partial_text == "Once upon a ":
            await asyncio.to_thread(mark_ready, ready, handle.run_id)
            break
        await asyncio.sleep(0.01)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
