"""Stream recovery R1-R4 and retries with the scripted provider, asserted on the committed
transcript: one complete assistant turn, no continuation prompt in it, no partial tool call
executed."""

from __future__ import annotations

from typing import Any

import pytest

from wakeful import ManualClock, Message
from wakeful.agent import Agent, StreamPolicy, tool
from wakeful.errors import RunFailed, RunInterrupted
from wakeful.providers.base import ProviderError, StreamEnd, TextDelta, ToolCallDelta
from wakeful.providers.scripted import Drop, Fail, Scripted, Stall, calls, reply, text, tool_call
from wakeful.runtime import Runtime
from wakeful.store.memory import MemoryStore

POLICY = StreamPolicy(checkpoint_every_deltas=1, checkpoint_min_interval=0, idle_timeout=0.2)


class FakeSleep:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def lookup_tool(counter: dict[str, int]) -> Any:
    @tool
    def lookup(city: str, days: int = 1) -> dict[str, Any]:
        """Weather for a city."""
        counter[city] = counter.get(city, 0) + 1
        return {"city": city, "days": days, "sky": "clear"}

    return lookup


async def run_agent(
    provider: Scripted, tools: list[Any] | None = None
) -> tuple[Any, list[Message], MemoryStore, Agent, FakeSleep]:
    store = MemoryStore(ManualClock())
    sleep = FakeSleep()
    agent = Agent("helper", provider, "Be brief.", tools or [], stream_policy=POLICY, sleep=sleep)
    reply_ = await agent.run(Runtime(store), "t", "What is the weather?")
    return reply_, await store.messages("t", 0, 100), store, agent, sleep


def assert_no_continuation_messages(messages: list[Message]) -> None:
    for m in messages:
        assert not m.id.startswith("continuation"), m
        assert "cut off" not in str(m.content)


@pytest.mark.asyncio
async def test_r1_text_only_continues_and_commits_one_turn() -> None:
    provider = Scripted.of([*text("Hello wor"), Drop()], reply("ld, sunny."))
    result, messages, store, agent, _ = await run_agent(provider)
    assert result.status == "completed" and result.text == "Hello world, sunny."
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == "Hello world, sunny."
    assert messages[1].metadata["recoveries"] == ["R1"]
    assert_no_continuation_messages(messages)
    continuation = provider.requests[1].messages
    assert continuation[-2].role == "assistant" and continuation[-2].content == "Hello wor"
    assert continuation[-1].role == "user"
    assert await store.stream_checkpoints.get(result.run_id) is None, "deleted after commit"
    assert agent.counters["checkpoints"] >= 2


@pytest.mark.asyncio
async def test_r2_complete_calls_are_the_turn_and_the_partial_one_is_dropped() -> None:
    counter: dict[str, int] = {}
    partial = tool_call(1, "call-2", "lookup", {"city": "Oslo"})[:1]
    provider = Scripted.of(
        [*tool_call(0, "call-1", "lookup", {"city": "Paris"}), *partial, Drop()],
        reply("Paris is clear."),
    )
    result, messages, _, _, _ = await run_agent(provider, [lookup_tool(counter)])
    assert counter == {"Paris": 1}, "the partial call never executed"
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert [c["id"] for c in messages[1].tool_calls] == ["call-1"]
    assert messages[1].metadata["recoveries"] == ["R2"]
    assert messages[2].tool_call_id == "call-1" and "clear" in str(messages[2].content)
    assert result.text == "Paris is clear."
    assert len(provider.requests) == 2, "R2 needs no continuation request"


@pytest.mark.asyncio
async def test_r3_text_and_an_unfinished_call_drops_the_call_and_continues() -> None:
    counter: dict[str, int] = {}
    provider = Scripted.of(
        [*text("Let me check"), ToolCallDelta(0, "call-1", "lookup", '{"ci'), Drop()],
        reply(" - it is sunny."),
    )
    result, messages, _, _, _ = await run_agent(provider, [lookup_tool(counter)])
    assert counter == {}
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == "Let me check - it is sunny." and messages[1].tool_calls == []
    assert messages[1].metadata["recoveries"] == ["R3"]
    assert_no_continuation_messages(messages)
    assert result.text == "Let me check - it is sunny."


@pytest.mark.asyncio
async def test_r4_nothing_usable_restarts_the_request() -> None:
    provider = Scripted.of(
        [ToolCallDelta(0, "call-1", "lookup", '{"city": "Pa'), Drop()],
        [Drop()],
        reply("Fresh answer."),
    )
    result, messages, _, _, _ = await run_agent(provider, [lookup_tool({})])
    assert result.text == "Fresh answer."
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].metadata["recoveries"] == ["R4", "retry"]
    for request in provider.requests:
        assert [m.role for m in request.messages] == ["user"], "a restart resends the request"


@pytest.mark.asyncio
async def test_failures_before_output_are_retried_honouring_capped_hints() -> None:
    provider = Scripted.of(
        [Fail("rate_limited", retry_after=7, status=429)],
        [Fail("rate_limited", retry_after=600, status=429)],
        [Fail("overloaded", status=529)],
        reply("ok"),
    )
    result, messages, _, _, sleep = await run_agent(provider)
    assert result.text == "ok" and len(provider.requests) == 4
    assert sleep.waits[:2] == [7, 60], "a hint of 600 s waits 60"
    assert 0 < sleep.waits[2] <= 30
    assert messages[1].metadata["recoveries"] == ["retry", "retry", "retry"]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["auth", "invalid_request", "context_overflow", "not_found"])
async def test_permanent_errors_are_not_retried(kind: Any) -> None:
    provider = Scripted.of([Fail(kind)], reply("never"))
    store = MemoryStore(ManualClock())
    agent = Agent("helper", provider, stream_policy=POLICY, sleep=FakeSleep())
    with pytest.raises(RunFailed, match=kind):
        await agent.run(Runtime(store), "t", "hi")
    assert len(provider.requests) == 1
    assert [m.role for m in await store.messages("t")] == ["user"]


@pytest.mark.asyncio
async def test_the_retry_budget_is_bounded_and_then_the_run_is_interrupted_not_failed() -> None:
    provider = Scripted.of(*[[Fail("server", status=500)] for _ in range(4)], reply("later"))
    store = MemoryStore(ManualClock())
    agent = Agent("helper", provider, stream_policy=StreamPolicy(max_retries=3), sleep=FakeSleep())
    runtime = Runtime(store)
    with pytest.raises(RunInterrupted, match="server"):
        await agent.run(runtime, "t", "hi")
    assert len(provider.requests) == 4
    snap = await store.read("t")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.status == "running" and snap.claim is None
    assert (await agent.recover(runtime, "t")).text == "later"


@pytest.mark.asyncio
async def test_an_idle_stream_counts_as_an_interruption() -> None:
    provider = Scripted.of([*text("Half an ans"), Stall()], reply("wer."))
    result, messages, _, _, _ = await run_agent(provider)
    assert result.text == "Half an answer."
    assert messages[1].metadata["recoveries"] == ["R1"]


@pytest.mark.asyncio
async def test_a_failing_checkpoint_store_never_fails_the_turn() -> None:
    class Broken:
        async def get(self, run_id: str) -> None:
            raise ProviderError("server", "unrelated")  # any exception

        async def put(self, checkpoint: Any) -> None:
            raise OSError("disk full")

        async def delete(self, run_id: str) -> None:
            raise OSError("disk full")

    class StoreWithBrokenCheckpoints(MemoryStore):
        @property
        def stream_checkpoints(self) -> Any:
            return Broken()

    store = StoreWithBrokenCheckpoints(ManualClock())
    provider = Scripted.of([*text("Hel"), Drop()], reply("lo"))
    agent = Agent("helper", provider, stream_policy=POLICY, sleep=FakeSleep())
    result = await agent.run(Runtime(store), "t", "hi")
    assert result.text == "Hello"
    assert agent.counters["checkpoint_failures"] >= 2


@pytest.mark.asyncio
async def test_a_saved_checkpoint_is_resumed_by_a_replacement_and_stale_ones_ignored() -> None:
    from wakeful.agent.recovery import StreamRecovery
    from wakeful.providers.base import ModelRequest
    from wakeful.records import StreamCheckpoint

    store = MemoryStore(ManualClock())
    claim = await store.claim("t", "replacement", 30)
    await store.stream_checkpoints.put(
        StreamCheckpoint(
            run_id="run-1",
            thread_id="t",
            model="m",
            partial_text="Once upon",
            retry_count=1,
            token=claim.token,
            task_id="s2-t0",
        )
    )
    request = ModelRequest(model="m", messages=(Message(id="u", role="user", content="story"),))
    provider = Scripted.of(reply(" a time."))
    recovery = StreamRecovery(
        provider,
        POLICY,
        "run-1",
        "t",
        "s2-t0",
        claim.token,
        checkpoints=store.stream_checkpoints,
        sleep=FakeSleep(),
    )
    turn = await recovery.turn(request)
    assert turn.text == "Once upon a time." and turn.recoveries == ["resumed", "R1"]
    assert provider.requests[0].messages[-2].content == "Once upon"

    stale = Scripted.of(reply("New turn."))
    other_task = StreamRecovery(
        stale,
        POLICY,
        "run-1",
        "t",
        "s4-t0",
        claim.token,
        checkpoints=store.stream_checkpoints,
        sleep=FakeSleep(),
    )
    assert (await other_task.turn(request)).text == "New turn."
    assert [m.role for m in stale.requests[0].messages] == ["user"]


def test_scripted_helpers_build_real_items() -> None:
    steps = calls(("c1", "f", {"a": 1}), preface="Hi")
    assert isinstance(steps[0], TextDelta) and isinstance(steps[-1], StreamEnd)
    args = "".join(s.arguments for s in steps if isinstance(s, ToolCallDelta))
    assert args == '{"a":1}'


@pytest.mark.asyncio
async def test_the_idle_guard_makes_no_task_per_delta_and_still_times_out() -> None:
    import asyncio
    from collections.abc import AsyncIterator

    from wakeful.agent.recovery import StreamRecovery
    from wakeful.providers.base import ModelRequest, Usage

    class Deltas:
        model = "m"

        def __init__(self, n: int, stall: bool) -> None:
            self.n, self.stall = n, stall

        def stream(self, request: Any) -> AsyncIterator[Any]:
            return self._play()

        async def _play(self) -> AsyncIterator[Any]:
            for i in range(self.n):
                await asyncio.sleep(0)
                yield TextDelta(str(i))
            if self.stall:
                await asyncio.Event().wait()
            yield StreamEnd("end_turn", Usage(1, self.n))

    def recovery(provider: Deltas, idle: float) -> StreamRecovery:
        policy = StreamPolicy(idle_timeout=idle, max_retries=0, checkpoints=False)
        return StreamRecovery(provider, policy, "run-1", "t", "s0-t0", 1, sleep=FakeSleep())

    request = ModelRequest(model="m", messages=(Message(id="u", role="user", content="hi"),))
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    created: list[str] = []

    def counting(loop_: Any, coro: Any, **kwargs: Any) -> Any:
        created.append(getattr(coro, "__qualname__", "?"))
        return asyncio.Task(coro, loop=loop_, **kwargs)

    loop.set_task_factory(counting)
    try:
        turn = await recovery(Deltas(200, False), 5.0).turn(request)
    finally:
        loop.set_task_factory(factory)
    assert turn.text == "".join(str(i) for i in range(200)) and created == []

    with pytest.raises(ProviderError) as timeout:
        await recovery(Deltas(3, True), 0.05).turn(request)
    assert timeout.value.kind == "timeout"
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0, "the timer's cancel was undone"
