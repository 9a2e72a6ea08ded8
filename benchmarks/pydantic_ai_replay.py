"""The cost of ``WakefulAgent``'s replay (decision 0048): a PydanticAI run of n sequential
tool calls (a ``FunctionModel`` calling one tool per response, then answering), plain
PydanticAI versus ``WakefulAgent`` on the SQLite store (``durability="sync"``): one commit
per step. A run stays alive between its supersteps, so nothing is replayed; before that
(every superstep replaying the run from its start) 45 tool calls took 33 s here, 0.9 s now.

Run: ``python -m benchmarks.pydantic_ai_replay [n ...]`` (default 5 20 45: PydanticAI
refuses more than 50 requests in a run by default)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from wakeful import open_store
from wakeful.pydantic_ai import WakefulAgent
from wakeful.runtime import Runtime


def chain(n: int) -> Agent[None, str]:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(1 for m in messages for p in m.parts if p.part_kind == "tool-return")
        if done >= n:
            return ModelResponse(parts=[TextPart(f"{done} steps")])
        return ModelResponse(parts=[ToolCallPart("step", {"i": done}, tool_call_id=f"c{done}")])

    agent: Agent[None, str] = Agent(FunctionModel(respond))

    @agent.tool_plain
    def step(i: int) -> int:
        return i + 1

    return agent


async def measure(n: int, directory: Path) -> tuple[float, float]:
    start = time.perf_counter()
    await chain(n).run("go")
    plain = time.perf_counter() - start
    store = await open_store(f"sqlite:///{directory / f'replay-{n}.db'}")
    try:
        wa = WakefulAgent(chain(n), name="chain", runtime=Runtime(store), max_steps=4 * n + 8)
        start = time.perf_counter()
        result = await wa.run("go", thread_id=f"t-{n}")
        wrapped = time.perf_counter() - start
        assert result.output == f"{n} steps"
    finally:
        await store.close()
    return plain, wrapped


async def main(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await measure(1, Path(tmp))  # warm-up: PydanticAI's schema building
        print(f"{'tool calls':>10} {'plain s':>9} {'wakeful s':>10} {'per step ms':>12}")
        for n in sizes:
            plain, wrapped = await measure(n, Path(tmp))
            per_step = wrapped / (2 * n + 1) * 1000
            print(f"{n:>10} {plain:>9.3f} {wrapped:>10.3f} {per_step:>12.1f}")


if __name__ == "__main__":
    asyncio.run(main([int(a) for a in sys.argv[1:]] or [5, 20, 45]))
