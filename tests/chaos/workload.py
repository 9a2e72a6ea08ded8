"""The work the chaos workers run: an agent with one tool per replay policy driven by a
deterministic model, a fan-out graph that sends messages to another thread, and the graph
that receives them. Every side effect is written to ``effects-<pid>.jsonl`` (fsynced) with
the fencing token and idempotency key it ran under.

The model answers from the request alone (the plan travels in the user message), so any
process, the first worker or its replacement, produces the same turns. A plan can ask for
calls with invalid or incomplete arguments, an unknown tool, and a dropped stream in the
middle of a call's arguments (dropped once per process: the retry then succeeds)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

from tests.chaos import ledger
from tests.chaos.probe import PID, Faults
from wakeful.agent import Agent, StreamPolicy, Tool, ToolContext, tool
from wakeful.agent.recovery import CONTINUATION_PROMPT
from wakeful.fleet import Registry
from wakeful.providers.base import (
    ModelRequest,
    StreamEnd,
    StreamItem,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from wakeful.runtime import END, START, CompiledGraph, Graph, NodeContext, Send, append

TOOLS = {"safe": "safe_op", "keyed": "keyed_op", "never": "never_op"}
CONTINUED = " (continued after a cut)"


def arguments_text(call: dict[str, Any]) -> str:
    """The argument text the model streams for a planned call."""
    n, bad = call["n"], call.get("bad")
    if bad == "type":
        return json.dumps({"n": str(n)})
    if bad == "extra":
        return json.dumps({"n": n, "zzz": 1})
    if bad == "cut":
        return json.dumps({"n": n})[:-1]
    return json.dumps({"n": n})


def call_name(call: dict[str, Any]) -> str:
    return "missing_op" if call.get("bad") == "unknown" else TOOLS[call["tool"]]


def call_id(turn: int, index: int) -> str:
    return f"c{turn}-{index}"


def plan_of(request: ModelRequest) -> dict[str, Any]:
    for message in request.messages:
        if message.role == "user" and isinstance(message.content, str):
            plan: dict[str, Any] = json.loads(message.content)["chaos"]
            return plan
    raise ValueError("no plan in the request")


class ChaosModel:
    """Turn ``k`` (the number of assistant messages in the request) plays ``plan["turns"][k]``;
    after the last one the model answers ``plan["final"]``."""

    model = "chaos-model"

    def __init__(self, faults: Faults, delay: float) -> None:
        self.faults = faults
        self.delay = delay
        self._dropped: set[tuple[str, int]] = set()

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        return self._reply(request)

    async def _reply(self, request: ModelRequest) -> AsyncIterator[StreamItem]:
        plan = plan_of(request)
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "user" and last.content == CONTINUATION_PROMPT:
            async for item in self._text(CONTINUED):
                yield item
            yield StreamEnd("end_turn", Usage(10, 5))
            return
        turn = sum(1 for m in request.messages if m.role == "assistant")
        if turn >= len(plan["turns"]):
            async for item in self._text(plan["final"]):
                yield item
            yield StreamEnd("end_turn", Usage(10, 5))
            return
        spec = plan["turns"][turn]
        drop = bool(spec.get("drop")) and (plan["thread"], turn) not in self._dropped
        if spec.get("preface"):
            async for item in self._text(spec["preface"]):
                yield item
        calls = spec["calls"]
        for index, call in enumerate(calls):
            raw = arguments_text(call)
            pieces = [raw[i : i + 3] for i in range(0, len(raw), 3)]
            if drop and index == len(calls) - 1:
                self._dropped.add((plan["thread"], turn))
                pieces = pieces[: max(1, len(pieces) // 2)]  # never the closing brace
            for number, piece in enumerate(pieces):
                await self._tick()
                if number == 0:
                    yield ToolCallDelta(
                        index=index, id=call_id(turn, index), name=call_name(call), arguments=piece
                    )
                else:
                    yield ToolCallDelta(index=index, arguments=piece)
            if drop and index == len(calls) - 1:
                return  # the connection drops in the middle of the call's arguments
        yield StreamEnd("tool_use", Usage(10, 5))

    async def _text(self, text: str) -> AsyncIterator[StreamItem]:
        for i in range(0, len(text), 5):
            await self._tick()
            yield TextDelta(text[i : i + 5])

    async def _tick(self) -> None:
        self.faults.reach("model.stream")
        await asyncio.sleep(self.delay)


def effect(directory: Path, record: dict[str, Any]) -> None:
    ledger.append(directory / f"effects-{PID}.jsonl", {"pid": PID, **record})


def tools(directory: Path, faults: Faults, rng: random.Random) -> list[Tool]:
    keyed_dir = directory / "keyed"
    keyed_dir.mkdir(exist_ok=True)

    async def body(kind: str, n: int, ctx: ToolContext) -> str:
        faults.reach("tool.before_effect", kind)
        applied: bool | None = None
        if kind == "keyed":
            # The downstream system deduplicates by key: the first request with a key applies.
            try:
                os.close(os.open(keyed_dir / ctx.idempotency_key, os.O_CREAT | os.O_EXCL))
                applied = True
            except FileExistsError:
                applied = False
        effect(
            directory,
            {
                "what": "tool",
                "kind": kind,
                "call": ctx.call_id,
                "thread": ctx.thread_id,
                "run": ctx.run_id,
                "key": ctx.idempotency_key,
                "token": ctx.fencing_token,
                "args": {"n": n},
                "int": type(n) is int,
                "applied": applied,
                "t0": time.monotonic(),
            },
        )
        faults.reach("tool.after_effect", kind)
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        return f"{kind} {n} ok"

    @tool(replay="safe")
    async def safe_op(n: int, ctx: ToolContext) -> str:
        """Read something (safe to repeat)."""
        return await body("safe", n, ctx)

    @tool(replay="keyed")
    async def keyed_op(n: int, ctx: ToolContext) -> str:
        """Write to a system that deduplicates by idempotency key."""
        return await body("keyed", n, ctx)

    @tool(replay="never")
    async def never_op(n: int, ctx: ToolContext) -> str:
        """An effect without idempotency: must never run twice."""
        return await body("never", n, ctx)

    return [safe_op, keyed_op, never_op]


class PipelineState(TypedDict):
    log: Annotated[list[str], append]
    inbox: str
    width: int


class ReceiverState(TypedDict):
    src: str
    i: int
    got: Annotated[list[str], append]


def pipeline(directory: Path, faults: Faults, rng: random.Random) -> CompiledGraph:
    """``fan`` sends ``width`` tasks to ``work``; each records its effect, emits a fact and
    sends one message to the ``inbox`` thread; ``join`` runs once after them."""

    def fan(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": ["fan"]}

    def spread(state: dict[str, Any]) -> list[Send]:
        return [Send("work", {"i": i, "inbox": state["inbox"]}) for i in range(state["width"])]

    async def work(arg: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        effect(
            directory,
            {
                "what": "node",
                "thread": ctx.thread_id,
                "run": ctx.run_id,
                "task": ctx.task_id,
                "token": ctx.fencing_token,
                "t0": time.monotonic(),
            },
        )
        faults.reach("node.work")
        await asyncio.sleep(rng.uniform(0.0, 0.1))
        ctx.emit("fact", {"token": ctx.fencing_token, "i": arg["i"]})
        ctx.send(arg["inbox"], {"src": ctx.thread_id, "i": arg["i"]})
        return {"log": [f"w{arg['i']}"]}

    def join(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        ctx.emit("fact", {"token": ctx.fencing_token, "join": True})
        return {"log": ["join"]}

    graph = Graph(PipelineState, name="chaos-pipeline")
    graph.node("fan", fan).node("work", work).node("join", join)
    graph.edge(START, "fan").conditional_edge("fan", spread, ["work"]).edge("work", "join")
    return graph.edge("join", END).compile()


def receiver(directory: Path) -> CompiledGraph:
    """Handles one delivered message per run (the worker consumes it at admission)."""

    async def receive(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        message = f"{state['src']}:{state['i']}"
        effect(
            directory,
            {
                "what": "receive",
                "thread": ctx.thread_id,
                "run": ctx.run_id,
                "task": ctx.task_id,
                "message": message,
                "token": ctx.fencing_token,
                "t0": time.monotonic(),
            },
        )
        ctx.emit("fact", {"token": ctx.fencing_token, "message": message})
        return {"got": [message]}

    graph = Graph(ReceiverState, name="chaos-receiver").node("receive", receive)
    return graph.edge(START, "receive").compile()


def registry(directory: Path, faults: Faults, seed: int) -> Registry:
    rng = random.Random(seed)
    agent = Agent(
        "chaos",
        ChaosModel(faults, delay=rng.uniform(0.002, 0.02)),
        "Follow the plan.",
        tools(directory, faults, rng),
        max_steps=8,
        stream_policy=StreamPolicy(
            max_retries=6,
            initial_backoff=0.02,
            max_backoff=0.2,
            idle_timeout=20,
            checkpoint_every_deltas=4,
            checkpoint_every_seconds=0.05,
            checkpoint_min_interval=0,
        ),
    )
    return (
        Registry(default="receiver")
        .add("agent", agent)
        .add("pipeline", pipeline(directory, faults, rng))
        .add("receiver", receiver(directory))
    )
