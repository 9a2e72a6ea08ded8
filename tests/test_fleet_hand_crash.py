"""An agent's tool call through a Remote Hand whose server is SIGKILLed in the middle of the
call and restarted on the same port: the call is never an error. A ``never`` tool is not
sent again and is recorded Indeterminate; a ``keyed`` tool is sent again with the same
operation id and gets the ledger's outcome (here ``indeterminate``: the process running it
died). A lost answer of a hand that stayed up is resolved from the ledger. In every case the
hand's tool ran exactly once (its effect counter, a file it appends to, has one line)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hand_support import DEADLINE, HandChild, until
from wakeful.agent import INDETERMINATE, Agent, AgentReply, ToolContext, tool
from wakeful.agent.tools import Replay
from wakeful.fleet.hand import HandIndeterminate, RemoteHand
from wakeful.providers.scripted import Scripted, calls, reply
from wakeful.records import Message
from wakeful.runtime import Runtime
from wakeful.store.memory import MemoryStore

THREAD = "thread-pay"
FINAL = "I told the customer what happened."


class Counting(httpx.AsyncHTTPTransport):
    """A real transport that remembers the method of every request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.methods: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.methods.append(request.method)
        return await super().handle_async_request(request)


def paying_agent(hand: RemoteHand, replay: Replay, hand_tool: str, pattern: str) -> Agent:
    if pattern == "documented":

        @tool(name="pay", replay=replay)
        async def pay(tag: str, ctx: ToolContext) -> Any:
            """Charge the customer (the documented pattern: pass ctx)."""
            return await hand.call(hand_tool, {"tag": tag}, ctx=ctx)

    else:

        @tool(name="pay", replay=replay)
        async def pay(tag: str, ctx: ToolContext) -> Any:
            """Charge the customer (the pattern documented before issue 26)."""
            try:
                return await hand.call(hand_tool, {"tag": tag}, operation_id=ctx.idempotency_key)
            except HandIndeterminate:
                return INDETERMINATE

    script = Scripted([calls(("call-1", "pay", {"tag": "k"})), reply(FINAL)])
    return Agent("payer", script, tools=[pay])


async def tool_result(store: MemoryStore) -> Message:
    results = [m for m in await store.messages(THREAD, 0, 100) if m.role == "tool"]
    assert len(results) == 1, results
    return results[0]


async def event_types(store: MemoryStore) -> list[str]:
    return [e.type for e in await store.events_after(THREAD, 0, 1000)]


def executions(workdir: Path) -> list[str]:
    return (workdir / "executions").read_text(encoding="utf-8").splitlines()


async def run_through_a_hand_kill(
    tmp_path: Path, replay: Replay, restart_after: float, pattern: str = "documented"
) -> tuple[AgentReply, MemoryStore, Counting, dict[str, Any] | None]:
    """Run the agent; SIGKILL the hand once its tool started, restart it on the same port
    ``restart_after`` seconds later; return the reply, the store, the requests sent and the
    restarted hand's ledger record of the call."""
    ledger = tmp_path / "ledger.db"
    first = HandChild(ledger, tmp_path, "first")
    second: HandChild | None = None
    transport = Counting()
    try:
        url = await first.url()
        port = int(url.rsplit(":", 1)[1])
        store = MemoryStore()
        async with httpx.AsyncClient(transport=transport) as client:
            hand = RemoteHand(url, client=client)  # the default recovery window
            agent = paying_agent(hand, replay, "block", pattern)
            run = asyncio.create_task(agent.run(Runtime(store), THREAD, "Charge it."))
            await until(lambda: (tmp_path / "started-k").exists() or run.done(), "the tool")
            assert not run.done(), run.result()
            os.kill(first.process.pid, signal.SIGKILL)
            assert first.stop(signal.SIGKILL) == -signal.SIGKILL
            (tmp_path / "started-k").unlink()
            await asyncio.sleep(restart_after)  # the fault: the hand is down this long
            second = HandChild(ledger, tmp_path, "second", port=port)
            assert await second.url() == url
            answer = await asyncio.wait_for(run, DEADLINE + restart_after)
            record = await hand.lookup(await operation_id(store))
    finally:
        first.stop(signal.SIGKILL)
        if second is not None:
            assert second.stop(signal.SIGTERM) == 0, second.output()
    assert not (tmp_path / "started-k").exists(), "the killed call never ran again"
    return answer, store, transport, record


async def operation_id(store: MemoryStore) -> str:
    """The idempotency key the tool task ran under (the message id embeds it)."""
    message = await tool_result(store)
    return message.id.removeprefix("m-").removesuffix("-r")


@pytest.mark.asyncio
@pytest.mark.parametrize("replay", ["never", "keyed"])
@pytest.mark.parametrize("restart_after", [0.3, pytest.param(5.0, marks=pytest.mark.slow)])
async def test_a_hand_killed_mid_call_is_indeterminate_never_an_error(
    tmp_path: Path, replay: Replay, restart_after: float
) -> None:
    answer, store, transport, record = await run_through_a_hand_kill(
        tmp_path, replay, restart_after
    )
    assert (answer.status, answer.text) == ("completed", FINAL)
    result = await tool_result(store)
    assert result.metadata["outcome"] == "indeterminate"
    assert result.content == INDETERMINATE
    assert (await event_types(store)).count("tool.indeterminate") == 1
    assert record is not None and record["status"] == "indeterminate"
    assert executions(tmp_path) == ["k"]
    if replay == "never":
        # Not sent again: resolved by reading the ledger once the hand was back.
        assert transport.methods.count("POST") == 1
        assert transport.methods.count("GET") >= 2
    else:
        # Sent again with the same operation id; the ledger answered without running it.
        assert transport.methods.count("POST") >= 2


@pytest.mark.asyncio
async def test_the_pre_issue_26_tool_pattern_records_indeterminate_too(tmp_path: Path) -> None:
    """Regression: a keyed tool written as documented before (``operation_id=``, catching
    ``HandIndeterminate`` and returning ``INDETERMINATE``) was recorded as an ``error``
    (``HandUnavailable`` after a ~1.4 s retry window) or as ``ok``, with no
    ``tool.indeterminate`` event."""
    answer, store, _, record = await run_through_a_hand_kill(tmp_path, "keyed", 0.3, "pre-26")
    assert answer.status == "completed"
    result = await tool_result(store)
    assert result.metadata["outcome"] == "indeterminate", result.content
    assert (await event_types(store)).count("tool.indeterminate") == 1
    assert record is not None and record["status"] == "indeterminate"
    assert executions(tmp_path) == ["k"]


@pytest.mark.asyncio
@pytest.mark.parametrize("replay", ["never", "keyed"])
async def test_a_lost_answer_is_resolved_from_the_ledger(tmp_path: Path, replay: Replay) -> None:
    """The hand stays up but the answer times out (0.3 s, the tool takes longer): the
    client resolves the call by its operation id and the run records the tool's result."""
    hand_process = HandChild(tmp_path / "ledger.db", tmp_path, "only")
    transport = Counting()
    try:
        url = await hand_process.url()
        store = MemoryStore()
        async with httpx.AsyncClient(transport=transport) as client:
            hand = RemoteHand(url, client=client, timeout=0.3, backoff=0.05, max_backoff=0.2)
            agent = paying_agent(hand, replay, "gate", "documented")
            run = asyncio.create_task(agent.run(Runtime(store), THREAD, "Charge it."))
            await until(lambda: (tmp_path / "started-k").exists() or run.done(), "the tool")
            await until(lambda: len(transport.methods) >= 3 or run.done(), "the resolution")
            assert not run.done(), run.result()
            (tmp_path / "release-k").touch()
            answer = await asyncio.wait_for(run, DEADLINE)
    finally:
        assert hand_process.stop(signal.SIGTERM) == 0, hand_process.output()
    assert (answer.status, answer.text) == ("completed", FINAL)
    result = await tool_result(store)
    assert result.metadata["outcome"] == "ok"
    assert result.content == '{"tag":"k","executions":1}'
    assert "tool.indeterminate" not in await event_types(store)
    assert executions(tmp_path) == ["k"]
    if replay == "never":
        assert transport.methods.count("POST") == 1
    else:
        assert transport.methods.count("GET") == 0
