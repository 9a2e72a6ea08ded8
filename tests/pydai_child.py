"""Child process for WakefulAgent crash tests: ``python -m tests.pydai_child MODE URL DIR``
(``stream URL SERVER_URL READY [WANT]``: stream from the loopback server until the stream
checkpoint is as WANT says, see ``wanted``).

The agent (``crash_agent``) is a PydanticAI ``Agent`` on a ``FunctionModel``: its first
model response calls the tool ``act`` (replay policy ``MODE``: safe, keyed or never; or
``structured``: a safe tool and a structured output); the second answers. Every model call
and every tool start is appended (fsynced) to DIR/model.txt and DIR/effects.txt. In the
child the tool hangs after recording its start, so the parent can SIGKILL the process
between the committed model response and the tool's recorded result."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.runtime_support import mark_ready
from wakeful import open_store
from wakeful.pydantic_ai import WakefulAgent, idempotency_key
from wakeful.records import StreamCheckpoint
from wakeful.runtime import ClaimPolicy, Runtime


class Invoice(BaseModel):
    number: str
    total: int


def record(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def tool_return(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        for part in message.parts:
            if part.part_kind == "tool-return":
                return str(part.content)
    return ""


def crash_agent(mode: str, directory: Path, hang: bool) -> WakefulAgent:
    """``mode`` ``reuse``: the ``never`` tool finishes and the process hangs in the second
    model call instead (its result is committed before the crash)."""
    structured = mode == "structured"
    reuse = mode == "reuse"

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        record(directory / "model.txt", f"call {len(messages)}")
        returned = tool_return(messages)
        if returned and reuse and hang:
            (directory / "started").write_text("x")
            await asyncio.Event().wait()
        if not returned:
            return ModelResponse(parts=[ToolCallPart("act", {"amount": 7}, tool_call_id="c-act")])
        if structured:
            args = {"number": "INV-1", "total": int(returned)}
            return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args)])
        return ModelResponse(parts=[TextPart(f"done: {returned}")])

    agent: Agent[None, object] = Agent(
        FunctionModel(model), output_type=Invoice if structured else str
    )

    @agent.tool_plain
    async def act(amount: int) -> int:
        record(directory / "effects.txt", f"act {amount} {idempotency_key()}")
        if hang and not reuse:
            (directory / "started").write_text("x")
            await asyncio.Event().wait()
        return amount * 6

    policy = "safe" if structured else "never" if reuse else mode
    return WakefulAgent(agent, name="crash", replay={"act": policy})


def writer(server_url: str, directory: Path | None = None) -> WakefulAgent:
    """A PydanticAI agent on PydanticAI's own OpenAI model, pointed at the loopback
    OpenAI-compatible server (tests/provider_server.py); checkpoints after every event. With
    ``directory``: a ``charge`` tool (replay ``never``) recording each run in
    DIR/effects.txt."""
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from wakeful.agent import StreamPolicy

    provider = OpenAIProvider(base_url=server_url, api_key="test-key")
    agent: Agent[None, str] = Agent(OpenAIChatModel("gpt-test", provider=provider))
    if directory is not None:
        effects = directory / "effects.txt"

        @agent.tool_plain
        def charge(amount: int) -> str:
            """Charge the customer (never twice)."""
            record(effects, f"charge {amount}")
            return f"charged {amount}"

    policy = StreamPolicy(checkpoint_every_deltas=1, checkpoint_min_interval=0)
    return WakefulAgent(agent, name="writer", stream_policy=policy, replay={"charge": "never"})


def wanted(saved: StreamCheckpoint | None, want: str) -> bool:
    """``text``: "Once upon a " so far; ``calls``: a complete tool call; ``text-call``:
    text and a tool call in flight."""
    if saved is None:
        return False
    if want == "calls":
        return bool(saved.tool_calls)
    if want == "text-call":
        return bool(saved.partial_text) and saved.in_flight_tool is not None
    return saved.partial_text == "Once upon a "


async def stream_until_checkpointed(
    url: str, server_url: str, ready: Path, want: str = "text"
) -> None:
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    agent = writer(server_url, ready.parent)
    handle = await agent.start("Tell me a story", thread_id="t", runtime=runtime)
    while True:
        saved = await store.stream_checkpoints.get(handle.run_id)
        if wanted(saved, want):
            await asyncio.to_thread(mark_ready, ready, handle.run_id)
            break
        await asyncio.sleep(0.01)
    await asyncio.Event().wait()


async def main(mode: str, url: str, directory: Path) -> None:
    store = await open_store(url)
    runtime = Runtime(store, ClaimPolicy(ttl=5, renew_every=1), holder="child")
    await crash_agent(mode, directory, hang=True).run("go", thread_id="t", runtime=runtime)


if __name__ == "__main__":
    if sys.argv[1] == "stream":
        want = sys.argv[5] if len(sys.argv) > 5 else "text"
        asyncio.run(stream_until_checkpointed(sys.argv[2], sys.argv[3], Path(sys.argv[4]), want))
    else:
        asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
