"""A fleet worker over PostgreSQL serving both framework wrappers:
``python -m tests.framework_fleet_child STORE_URL WAKE_URL WORKER_ID DIR SERVER_URL``.

Targets: ``pydai``, a ``WakefulAgent`` (PydanticAI's ``OpenAIChatModel``), and ``oai``, an
Agents SDK agent (``OpenAIChatCompletionsModel``) through ``WakefulRunner.agent``; both on
the loopback OpenAI-compatible server at SERVER_URL, both with ``charge``, a
``replay="never"`` tool that appends its target's thread (``t-pydai``, ``t-oai``: the test
runs one thread per target) to DIR/charges.txt (fsynced). Model
streams are checkpointed after every delta. SIGTERM stops the worker gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from wakeful import open_store
from wakeful.agent import StreamPolicy
from wakeful.fleet import Registry, Worker
from wakeful.fleet.pgwake import PostgresWake
from wakeful.runtime import ClaimPolicy
from wakeful.store.contract import Store

TTL = 2.0


def charged(directory: Path, thread_id: str) -> None:
    with (directory / "charges.txt").open("a", encoding="utf-8") as f:
        f.write(thread_id + "\n")
        f.flush()
        os.fsync(f.fileno())


def policy() -> StreamPolicy:
    return StreamPolicy(checkpoint_every_deltas=1, checkpoint_min_interval=0, idle_timeout=60)


def pydai_target(directory: Path, server_url: str) -> object:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from wakeful.pydantic_ai import WakefulAgent

    provider = OpenAIProvider(base_url=server_url, api_key="test-key")
    agent: Agent[None, str] = Agent(OpenAIChatModel("gpt-test", provider=provider))

    @agent.tool_plain
    def charge(amount: int) -> str:
        """Charge the customer (never twice)."""
        charged(directory, "t-pydai")
        return f"charged {amount}"

    return WakefulAgent(agent, name="pydai", replay={"charge": "never"}, stream_policy=policy())


def oai_target(directory: Path, server_url: str, store: Store) -> object:
    from agents import Agent as SDKAgent
    from agents import OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from wakeful.openai_agents import WakefulRunner
    from wakeful.runtime import Runtime

    set_tracing_disabled(True)

    @function_tool
    def charge(amount: int) -> str:
        """Charge the customer (never twice)."""
        charged(directory, "t-oai")
        return f"charged {amount}"

    client = AsyncOpenAI(base_url=server_url, api_key="test-key", max_retries=0)
    model = OpenAIChatCompletionsModel(model="gpt-test", openai_client=client)
    agent = SDKAgent(name="writer", instructions="Tell stories.", model=model, tools=[charge])
    # the runner's runtime serves embedded runs only; the worker brings its own
    runner = WakefulRunner(Runtime(store), replay={"charge": "never"}, stream_policy=policy())
    return runner.agent(agent)


async def main(url: str, wake_url: str, worker_id: str, directory: Path, server_url: str) -> None:
    store = await open_store(url, pool_size=4, pool_timeout=5.0, wake_url=wake_url)
    wake = PostgresWake(wake_url)
    registry = Registry().add("pydai", pydai_target(directory, server_url))
    registry.add("oai", oai_target(directory, server_url, store))
    worker = Worker(
        store,
        registry,
        concurrency=2,
        claims=ClaimPolicy(ttl=TTL, renew_every=TTL / 4),
        wake=wake,
        worker_id=worker_id,
        poll_interval=0.2,
        retry_backoff=0.05,
        max_retry_backoff=0.5,
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
    await store.close()
    print(json.dumps(asdict(worker.stats)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5]))
