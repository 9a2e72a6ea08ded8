"""Child for the Agents SDK stream-recovery test: an SDK agent whose model is the SDK's own
``OpenAIChatCompletionsModel`` on the loopback OpenAI-compatible server calls a ``never``
tool, then streams its answer; reports once a stream checkpoint holds WANT as its partial
text ("Once upon a " by default).
``python -m tests.oai_stream_child URL SERVER_URL DIR [WANT]``."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent as SDKAgent
from agents import OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from tests.runtime_support import mark_ready
from wakeful import open_store
from wakeful.agent import StreamPolicy
from wakeful.openai_agents import WakefulRunner
from wakeful.runtime import ClaimPolicy, Runtime


def writer(server_url: str, directory: Path) -> tuple[SDKAgent[Any], AsyncOpenAI]:
    set_tracing_disabled(True)

    @function_tool
    def charge(amount: int) -> str:
        """Charge the customer (never twice)."""
        with (directory / "effects.txt").open("a", encoding="utf-8") as f:
            f.write(f"charge {amount}\n")
            f.flush()
            os.fsync(f.fileno())
        return f"charged {amount}"

    client = AsyncOpenAI(base_url=server_url, api_key="test-key", max_retries=0)
    model = OpenAIChatCompletionsModel(model="gpt-test", openai_client=client)
    agent = SDKAgent(name="writer", instructions="Tell stories.", model=model, tools=[charge])
    return agent, client


def runner(runtime: Runtime) -> WakefulRunner:
    policy = StreamPolicy(checkpoint_every_deltas=1, checkpoint_min_interval=0, idle_timeout=30)
    return WakefulRunner(runtime, replay={"charge": "never"}, stream_policy=policy)


async def main(url: str, server_url: str, directory: Path, want: str = "Once upon a ") -> None:
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    agent, _ = writer(server_url, directory)
    handle = await runner(runtime).agent(agent).start(runtime, "t", "Charge 5, then a story")
    while True:
        saved = await store.stream_checkpoints.get(handle.run_id)
        if saved is not None and saved.partial_text == want:
            await asyncio.to_thread(mark_ready, directory / "ready", handle.run_id)
            break
        await asyncio.sleep(0.01)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), *sys.argv[4:5]))
