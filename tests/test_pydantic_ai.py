"""``wakeful.pydantic_ai.WakefulAgent``: a PydanticAI agent run as a durable wakeful run.

PydanticAI's own TestModel and FunctionModel run unchanged under the wrapper; every model
response and tool result is a thread message; a second run on the thread sees the first
exchange; a SIGKILLed run recovers in another process paying for nothing recorded, with
each tool following its replay policy."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from tests.pydai_child import Invoice, crash_agent
from tests.runtime_support import kill_when_ready, store_url
from wakeful import ManualClock, open_store
from wakeful.pydantic_ai import INDETERMINATE, WakefulAgent
from wakeful.runtime import ClaimPolicy, Runtime
from wakeful.store.memory import MemoryStore


class Weather(BaseModel):
    city: str
    degrees: int


def function_model(calls: list[int]) -> FunctionModel:
    """Calls ``add`` once, then answers with the tool's result."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(len(messages))
        for message in messages:
            for part in message.parts:
                if part.part_kind == "tool-return":
                    return ModelResponse(parts=[TextPart(f"sum is {part.content}")])
        return ModelResponse(parts=[ToolCallPart("add", {"a": 2, "b": 3}, tool_call_id="c1")])

    return FunctionModel(respond)


def make_agent(
    kind: str, model_calls: list[int], tool_runs: list[tuple[int, int]]
) -> Agent[None, str]:
    model = TestModel() if kind == "test" else function_model(model_calls)
    agent: Agent[None, str] = Agent(model, instructions="Be brief.")

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        tool_runs.append((a, b))
        return a + b

    return agent


pytest_plugins = ["tests.postgres_fixtures"]


@pytest.fixture(
    params=["memory", "file", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    from tests.postgres_support import Databases

    pg: Databases | None = None
    if request.param == "postgres":
        pg = request.getfixturevalue("pg_databases")
    if pg is not None:
        return asyncio.run(pg.clone())
    return "memory://" if request.param == "memory" else store_url(request.param, tmp_path)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["test", "function"])
async def test_framework_models_run_unchanged_under_the_wrapper(kind: str, url: str) -> None:
    plain_calls: list[int] = []
    plain_runs: list[tuple[int, int]] = []
    plain = await make_agent(kind, plain_calls, plain_runs).run("add two and three")

    calls: list[int] = []
    runs: list[tuple[int, int]] = []
    store = await open_store(url)
    wa = WakefulAgent(make_agent(kind, calls, runs), name="support", runtime=Runtime(store))
    try:
        result = await wa.run("add two and three", thread_id="t-1")
        messages = await store.messages("t-1", 0, 100)
    finally:
        await store.close()

    assert result.output == plain.output
    assert runs == plain_runs and len(runs) == 1, "each tool call ran once"
    assert calls == plain_calls, "each model request was made once, with the same history"
    assert [m.kind for m in result.new_messages()] == [m.kind for m in plain.new_messages()]
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[0].content == "add two and three"
    assert messages[1].tool_calls[0]["name"] == "add"
    assert messages[2].metadata["outcome"] == "ok"
    assert messages[2].content == {"test": "0", "function": "5"}[kind]
    assert messages[3].content == plain.output
    assert wa.steps_taken == 3, "two model requests and one tool call"


@pytest.mark.asyncio
async def test_a_second_run_on_the_thread_sees_the_first_exchange() -> None:
    seen: list[list[str]] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        texts = [
            str(p.content)
            for m in messages
            for p in m.parts
            if isinstance(p, UserPromptPart | TextPart)
        ]
        seen.append(texts)
        return ModelResponse(parts=[TextPart(f"answer {len(seen)}")])

    store = MemoryStore()
    wa = WakefulAgent(Agent(FunctionModel(respond)), name="chat", runtime=Runtime(store))
    await wa.run("my name is Ada", thread_id="t-2")
    second = await wa.run("what is my name?", thread_id="t-2")
    assert seen[1] == ["my name is Ada", "answer 1", "what is my name?"]
    assert second.output == "answer 2"
    assert len(second.all_messages()) == 4 and len(second.new_messages()) == 2
    fresh = await wa.run("hello")
    assert seen[2] == ["hello"], "without thread_id a run starts a fresh thread"
    assert fresh.output == "answer 3"
    assert [m.content for m in await store.messages("t-2", 0, 100)] == [
        "my name is Ada",
        "answer 1",
        "what is my name?",
        "answer 2",
    ]


@pytest.mark.asyncio
async def test_structured_output_and_the_output_tool_return_are_on_the_thread() -> None:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        name = info.output_tools[0].name
        return ModelResponse(parts=[ToolCallPart(name, {"city": "Oslo", "degrees": -3})])

    store = MemoryStore()
    agent: Agent[None, Weather] = Agent(FunctionModel(respond), output_type=Weather)
    wa = WakefulAgent(agent, name="weather", runtime=Runtime(store))
    result = await wa.run("weather in Oslo?", thread_id="t-3")
    assert result.output == Weather(city="Oslo", degrees=-3)
    messages = await store.messages("t-3", 0, 100)
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[2].tool_call_id == messages[1].tool_calls[0]["id"]


@pytest.mark.asyncio
async def test_run_stream_and_iter_replay_the_recorded_run_without_model_calls() -> None:
    calls: list[int] = []
    runs: list[tuple[int, int]] = []
    store = MemoryStore()
    wa = WakefulAgent(make_agent("function", calls, runs), name="s", runtime=Runtime(store))
    async with wa.run_stream("add", thread_id="t-4") as stream:
        chunks = [chunk async for chunk in stream.stream_text(delta=True)]
    assert "".join(chunks) == "sum is 5"
    assert len(calls) == 2 and len(runs) == 1, "the stream replayed; nothing ran twice"
    async with wa.iter("add again", thread_id="t-5") as agent_run:
        nodes = [type(node).__name__ async for node in agent_run]
    assert agent_run.result is not None and agent_run.result.output == "sum is 5"
    assert nodes.count("ModelRequestNode") == 2 and nodes[-1] == "End"
    assert len(calls) == 4 and len(runs) == 2


def test_run_sync_runs_on_its_own_loop() -> None:
    calls: list[int] = []
    runs: list[tuple[int, int]] = []
    store = MemoryStore()
    wa = WakefulAgent(make_agent("function", calls, runs), name="s", runtime=Runtime(store))
    assert wa.run_sync("add", thread_id="t-6").output == "sum is 5"
    assert runs == [(2, 3)]


def test_an_unknown_replay_policy_is_refused() -> None:
    from wakeful.errors import InvalidInput

    with pytest.raises(InvalidInput, match="sometimes"):
        WakefulAgent(Agent(TestModel()), name="x", replay={"t": "sometimes"})


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["never", "keyed", "safe", "structured", "reuse"])
async def test_a_sigkilled_run_recovers_in_another_process(mode: str, tmp_path: Path) -> None:
    url = store_url("sqlite", tmp_path)
    argv = ["tests.pydai_child", mode, url, str(tmp_path)]
    await asyncio.to_thread(kill_when_ready, argv, [tmp_path / "started"])
    assert lines(tmp_path / "model.txt") == ["call 1"] + ["call 3"] * (mode == "reuse")
    assert len(lines(tmp_path / "effects.txt")) == 1

    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
    store = await open_store(url, clock=clock)
    try:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="new")
        wa = crash_agent(mode, tmp_path, hang=False)
        result = await wa.recover("t", runtime=runtime)
        model_calls = lines(tmp_path / "model.txt")
        effects = lines(tmp_path / "effects.txt")
        # the recorded first response was reused (``reuse``: the second was interrupted)
        assert model_calls == ["call 1", "call 3"] + ["call 3"] * (mode == "reuse")
        messages = await store.messages("t", 0, 100)
        tool = next(m for m in messages if m.role == "tool")
        if mode == "never":
            assert len(effects) == 1, "a never tool whose start was recorded is not run again"
            assert tool.metadata["outcome"] == "indeterminate"
            assert result.output == f"done: {INDETERMINATE}"
        elif mode == "reuse":
            assert len(effects) == 1, "the never tool's recorded result was reused"
            assert tool.metadata["outcome"] == "ok"
        else:
            assert len(effects) == 2 and tool.metadata["outcome"] == "ok"
            first_key, second_key = (line.split()[-1] for line in effects)
            if mode == "keyed":
                assert first_key == second_key, "a keyed tool keeps its idempotency key"
        if mode == "structured":
            assert result.output == Invoice(number="INV-1", total=42)
        elif mode != "never":
            assert result.output == "done: 42"
        assert [m.role for m in messages][:4] == ["user", "assistant", "tool", "assistant"]
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_fleet_worker_runs_a_wakeful_agent_target() -> None:
    from tests.test_fleet_worker import Env, dispatch_status
    from wakeful.fleet import submit

    env = Env()
    try:
        calls: list[int] = []
        runs: list[tuple[int, int]] = []
        wa = WakefulAgent(make_agent("function", calls, runs), name="adder")
        env.registry.add("adder", wa)
        assert env.registry.get("adder").input_schema()["type"] == "string"
        env.worker("w1")
        await submit(
            env.store, "t-f", "adder", "add two and three", dispatch_id="d1", wake=env.wake
        )
        await dispatch_status(env, "d1", "done")
        messages = await env.store.messages("t-f", 0, 100)
        assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[0].content == "add two and three"
        assert messages[-1].content == "sum is 5" and runs == [(2, 3)] and len(calls) == 2
    finally:
        await env.close()


@pytest.mark.asyncio
async def test_a_sigkilled_stream_is_continued_not_generated_again(tmp_path: Path) -> None:
    from tests.provider_server import ProviderServer, Reply, openai_text
    from tests.pydai_child import writer

    url = store_url("sqlite", tmp_path)
    ready = tmp_path / "ready"
    with ProviderServer() as server:
        server.push(Reply(events=openai_text("Once ", "upon ", "a "), stall_after=4))
        argv = ["tests.pydai_child", "stream", url, server.url, str(ready)]
        await asyncio.to_thread(kill_when_ready, argv, [ready])
        run_id = ready.read_text()
        server.push(Reply(events=openai_text("time.")))

        clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))
        store = await open_store(url, clock=clock)
        try:
            runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="new")
            result = await writer(server.url).recover("t", runtime=runtime)
            assert result.output == "Once upon a time.", "equals the uninterrupted answer"
            assert len(server.bodies) == 2, "one continued request, no second generation"
            continuation = server.bodies[1]["messages"]
            assert continuation[-2] == {"role": "assistant", "content": "Once upon a "}
            assert continuation[-1]["role"] == "user"
            messages = await store.messages("t", 0, 100)
            assert [m.role for m in messages] == ["user", "assistant"]
            assert messages[1].content == "Once upon a time."
            assert messages[1].metadata["recoveries"] == ["resumed", "R1"]
            assert await store.stream_checkpoints.get(run_id) is None, "deleted after commit"
        finally:
            await store.close()


@pytest.mark.asyncio
async def test_parallel_tool_calls_are_taken_one_per_superstep_and_run_once() -> None:
    def build(ran: list[str]) -> Agent[None, str]:
        agent: Agent[None, str] = Agent(TestModel())

        @agent.tool_plain
        async def lookup(city: str) -> str:
            ran.append("lookup")
            return "sunny"

        @agent.tool_plain
        async def charge(amount: int) -> str:
            ran.append("charge")
            return "charged"

        return agent

    plain_ran: list[str] = []
    plain = await build(plain_ran).run("go")
    ran: list[str] = []
    store = MemoryStore()
    wa = WakefulAgent(build(ran), name="p", runtime=Runtime(store), replay={"charge": "never"})
    result = await wa.run("go", thread_id="t-p")
    assert result.output == plain.output
    assert sorted(ran) == sorted(plain_ran) == ["charge", "lookup"]
    assert wa.steps_taken == 4, "two model requests, two tool calls, one superstep each"
    roles = [m.role for m in await store.messages("t-p", 0, 100)]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]


def test_the_example_desk_runs_against_a_local_openai_compatible_server(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.chat_server import ChatServer

    root = Path(__file__).resolve().parent.parent
    args = {"lookup_order": {"order_id": 42}, "refund": {"order_id": 42}}
    with ChatServer(args) as model:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_API_KEY": "sk-local-test",
            "WAKEFUL_MODEL": "local-test-model",
            "WAKEFUL_STORE": f"sqlite:///{tmp_path / 'desk.db'}",
            "SUPPORT_LEDGER": str(tmp_path / "refunds.jsonl"),
            "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)]),
        }
        done = subprocess.run(
            [sys.executable, "-m", "examples.pydantic_ai_desk.app", "Refund order 42"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=root,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    assert "refunded order 42" in done.stdout
    assert len((tmp_path / "refunds.jsonl").read_text().splitlines()) == 1

    async def roles() -> list[str]:
        store = await open_store(f"sqlite:///{tmp_path / 'desk.db'}")
        try:
            return [m.role for m in await store.messages("desk-1", 0, 100)]
        finally:
            await store.close()

    assert asyncio.run(roles()) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]


@pytest.mark.asyncio
@pytest.mark.parametrize("decision", ["approve", {"approve": False, "reason": "too much"}])
async def test_deferred_approvals_suspend_the_run_with_a_ticket(decision: Any) -> None:
    from pydantic_ai import DeferredToolRequests

    transfers: list[int] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for message in messages:
            for part in message.parts:
                if part.part_kind == "tool-return":
                    return ModelResponse(parts=[TextPart(f"result: {part.content}")])
        return ModelResponse(parts=[ToolCallPart("transfer", {"amount": 100}, tool_call_id="c-t")])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(respond), output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True)
    def transfer(amount: int) -> str:
        transfers.append(amount)
        return f"moved {amount}"

    store = MemoryStore()
    wa = WakefulAgent(agent, name="bank", runtime=Runtime(store), replay={"transfer": "never"})
    first = await wa.run("pay 100", thread_id="t-a")
    assert isinstance(first.output, DeferredToolRequests), "PydanticAI's own answer"
    assert [c.tool_call_id for c in first.output.approvals] == ["c-t"]
    snap = await store.read("t-a")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "suspended" and transfers == []
    (ticket,) = snap.checkpoint.metadata["tickets"]
    assert ticket["question"]["approval"][0]["tool"] == "transfer"

    final = await wa.resume("t-a", decision)
    if decision == "approve":
        assert transfers == [100] and final.output == "result: moved 100"
    else:
        assert transfers == [] and final.output == "result: too much"
    messages = await store.messages("t-a", 0, 100)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2].tool_call_id == "c-t"
    assert messages[2].metadata["outcome"] == ("ok" if decision == "approve" else "deferred")
    snap = await store.read("t-a")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "completed"


@pytest.mark.asyncio
async def test_a_run_stays_alive_between_supersteps_instead_of_replaying() -> None:
    starts: list[int] = []
    calls: list[int] = []
    runs: list[tuple[int, int]] = []
    agent = make_agent("function", calls, runs)

    @agent.system_prompt
    def started() -> str:
        starts.append(1)  # PydanticAI evaluates it once per run start (empty history)
        return "Add."

    store = MemoryStore()
    wa = WakefulAgent(agent, name="alive", runtime=Runtime(store))
    result = await wa.run("add", thread_id="t-alive")
    assert result.output == "sum is 5" and wa.steps_taken == 3
    assert len(starts) == 1, "one PydanticAI run for three supersteps: nothing replayed"
    assert wa._sessions == {}, "the session ends with the run"
