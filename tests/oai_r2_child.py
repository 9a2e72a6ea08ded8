"""Child for the Agents SDK's R2 test: ``python -m tests.oai_r2_child URL DIR``.

The SDK agent's model (the SDK's own ``ScriptedModel``) streams a complete function call
(``output_item.done``, as a Responses API model does before its stream ends) and then
hangs; the child reports once the stream checkpoint holds the complete call, so the parent
can SIGKILL it before the turn was committed."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent as SDKAgent
from agents import function_tool
from agents.testing import ModelStep, ScriptedModel, assistant_message
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputItemDoneEvent

from tests.runtime_support import mark_ready
from wakeful import open_store
from wakeful.agent import StreamPolicy
from wakeful.openai_agents import WakefulRunner
from wakeful.runtime import ClaimPolicy, Runtime

CALL = ResponseFunctionToolCall(
    type="function_call", call_id="c-charge", name="charge", arguments='{"amount": 5}'
)


async def cut(call: Any) -> AsyncIterator[Any]:
    yield ResponseOutputItemDoneEvent(
        type="response.output_item.done", item=CALL, output_index=0, sequence_number=0
    )
    await asyncio.Event().wait()  # the rest never comes: the process is killed here


def agent(directory: Path, *, recovering: bool) -> tuple[SDKAgent[Any], ScriptedModel]:
    @function_tool
    def charge(amount: int) -> str:
        """Charge the customer (never twice)."""
        with (directory / "effects.txt").open("a", encoding="utf-8") as f:
            f.write(f"charge {amount}\n")
            f.flush()
            os.fsync(f.fileno())
        return f"charged {amount}"

    steps: list[Any] = (
        [[assistant_message("Charged 5.")]] if recovering else [ModelStep.stream(cut)]
    )
    model = ScriptedModel(steps)
    return SDKAgent(name="cashier", model=model, tools=[charge]), model


def runner(runtime: Runtime) -> WakefulRunner:
    policy = StreamPolicy(checkpoint_every_deltas=1, checkpoint_min_interval=0, idle_timeout=60)
    return WakefulRunner(runtime, replay={"charge": "never"}, stream_policy=policy)


async def main(url: str, directory: Path) -> None:
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    sdk, _ = agent(directory, recovering=False)
    handle = await runner(runtime).agent(sdk).start(runtime, "t", "Charge 5")
    while True:
        saved = await store.stream_checkpoints.get(handle.run_id)
        if saved is not None and saved.tool_calls:
            await asyncio.to_thread(mark_ready, directory / "ready", handle.run_id)
            break
        await asyncio.sleep(0.01)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
