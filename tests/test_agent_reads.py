"""The reads a run saves (issue 24, part 2): a fresh run reads no stream checkpoint and, on a
thread without messages, no history; a recovered run still resumes from its checkpoint; a
resumed or recovered run's first tasks are not fresh."""

from __future__ import annotations

import collections
from typing import Annotated, Any, TypedDict

import pytest

from wakeful import ManualClock
from wakeful.agent import Agent, StreamPolicy
from wakeful.errors import RunInterrupted
from wakeful.providers.base import ProviderError
from wakeful.providers.scripted import Drop, Scripted, reply, text
from wakeful.records import Message
from wakeful.runtime import START, Graph, NodeContext, Runtime, append
from wakeful.store.memory import MemoryStore

POLICY = StreamPolicy(checkpoint_every_deltas=1, checkpoint_min_interval=0, max_retries=0)


class Sleepless:
    async def __call__(self, seconds: float) -> None:
        return None


def counted(store: MemoryStore) -> collections.Counter[str]:
    """Count the store's history reads and stream-checkpoint calls (patched on the
    instance, as the runtime and the agent look them up at each call)."""
    counts: collections.Counter[str] = collections.Counter()
    checkpoints = store.stream_checkpoints

    def wrap(owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            counts[label] += 1
            return await fn(*args, **kwargs)

        setattr(owner, name, call)

    wrap(store, "messages", "messages")
    for name in ("get", "put", "delete", "discard"):
        wrap(checkpoints, name, f"checkpoints.{name}")
    return counts


@pytest.mark.asyncio
async def test_a_fresh_run_reads_no_stream_checkpoint_and_no_history_of_an_empty_thread() -> None:
    store = MemoryStore(ManualClock())
    counts = counted(store)
    provider = Scripted.of(reply("Hi there."), reply("Again."))
    agent = Agent("helper", provider, stream_policy=POLICY, sleep=Sleepless())
    runtime = Runtime(store)
    first = await agent.run(runtime, "t", Message(id="u1", role="user", content={"q": (1, 2)}))
    assert first.text == "Hi there."
    assert counts["checkpoints.get"] == 0 and counts["messages"] == 0
    assert counts["checkpoints.put"] >= 1 and counts["checkpoints.discard"] == 1
    assert await store.stream_checkpoints.get(first.run_id) is None
    # the history the model saw is what a read returns (JSON values: the tuple is a list)
    (seen,) = provider.requests[0].messages
    assert seen == (await store.messages("t"))[0] and seen.content == {"q": [1, 2]}

    # the thread now has messages: the next run reads them once, and still no checkpoint
    counts.clear()
    second = await agent.run(runtime, "t", "more")
    assert second.text == "Again."
    assert counts["messages"] == 1 and counts["checkpoints.get"] == 0
    assert [m.content for m in provider.requests[1].messages] == [
        {"q": [1, 2]},
        "Hi there.",
        "more",
    ]


@pytest.mark.asyncio
async def test_a_recovered_run_resumes_from_the_stream_checkpoint_it_finds() -> None:
    store = MemoryStore(ManualClock())
    counts = counted(store)
    provider = Scripted.of([*text("Hello wor"), Drop()], reply("ld."))
    agent = Agent("helper", provider, stream_policy=POLICY, sleep=Sleepless())
    runtime = Runtime(store)
    with pytest.raises(RunInterrupted):  # no retries: the turn stops with its checkpoint saved
        await agent.run(runtime, "t", "hi")
    snap = await store.read("t")
    assert snap is not None and snap.checkpoint is not None
    saved = await store.stream_checkpoints.get(snap.checkpoint.run_id)
    assert saved is not None and saved.partial_text == "Hello wor"
    counts.clear()

    recovered = await agent.recover(runtime, "t")
    assert recovered.text == "Hello world."
    assert counts["checkpoints.get"] == 1, "the recovered turn looks for its checkpoint"
    (assistant,) = [m for m in await store.messages("t") if m.role == "assistant"]
    assert assistant.metadata["recoveries"] == ["resumed", "R1"]
    assert await store.stream_checkpoints.get(recovered.run_id) is None


class Log(TypedDict):
    log: Annotated[list[str], append]


@pytest.mark.asyncio
async def test_only_the_tasks_of_a_checkpoint_this_attempt_committed_are_fresh() -> None:
    seen: list[tuple[str, bool, bool]] = []
    crash = {"on": True}

    async def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        seen.append(("ask", ctx.fresh, ctx.recovered))
        return {"log": [str(ctx.interrupt("ok?"))]}

    async def after(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        seen.append(("after", ctx.fresh, ctx.recovered))
        if crash["on"]:
            crash["on"] = False
            raise ProviderError("connection", "lost the model")  # transient: interrupted
        return {"log": ["after"]}

    g = Graph(Log)
    g.node("ask", ask).node("after", after)
    g.edge(START, "ask")
    g.edge("ask", "after")
    graph = g.compile()
    store = MemoryStore(ManualClock())
    runtime = Runtime(store)
    outcome = await (await runtime.start("t", graph, {})).result()
    (ticket,) = outcome.tickets
    with pytest.raises(RunInterrupted):
        await (await runtime.resume("t", graph, {ticket.id: "yes"})).result()
    done = await (await runtime.recover("t", graph)).result()
    assert done.state == {"log": ["yes", "after"]}
    assert seen == [
        ("ask", True, False),  # a new run's first checkpoint, committed by its admission
        ("ask", False, False),  # resumed: the suspended attempt started it
        ("after", True, False),  # a checkpoint the resuming attempt committed
        ("after", False, True),  # recovered: the interrupted attempt started it
    ]


@pytest.mark.asyncio
async def test_deltas_nobody_would_receive_are_not_built_and_a_subscriber_gets_them() -> None:
    store = MemoryStore(ManualClock())
    runtime = Runtime(store)
    provider = Scripted.of(reply("One two."), reply("Three four."))
    agent = Agent("helper", provider, stream_policy=POLICY, sleep=Sleepless())
    built: list[str] = []
    emit = runtime.live.emit

    def recording(loop: Any, thread_id: str, run_id: str, type: str, data: Any) -> None:
        built.append(type)
        emit(loop, thread_id, run_id, type, data)

    runtime.live.emit = recording  # type: ignore[method-assign]
    await agent.run(runtime, "t", "hi")
    assert "text.delta" not in built and "message.started" in built

    built.clear()
    streamed = [
        item.data["text"]
        async for item in agent.stream(runtime, "t", "again")
        if getattr(item, "type", None) == "text.delta"
    ]
    assert "".join(streamed) == "Three four." and "text.delta" in built
