"""``put`` and ``put_writes`` calls that arrive together on one thread share one commit
(``wakeful.langgraph.appends``), and every caller still gets its own answer."""

from __future__ import annotations

import asyncio
import contextlib
import operator
from collections import Counter
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph

from wakeful import ManualClock, open_store
from wakeful.errors import InvalidInput, StaleClaim
from wakeful.langgraph import WakefulSaver
from wakeful.store.contract import Store


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def three_nodes(saver: Any) -> Any:
    builder = StateGraph(State)
    for name in ("a", "b", "c"):
        builder.add_node(name, lambda state, tag=name: {"log": [tag]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder.compile(checkpointer=saver)


def counting(store: Store) -> Counter[str]:
    """Count the store's durable writes by kind (wraps the instance's methods)."""
    calls: Counter[str] = Counter()
    for name in ("claim", "commit", "claim_and_commit", "read"):
        method = getattr(store, name)

        async def wrapped(*args: Any, _method: Any = method, _name: str = name) -> Any:
            calls[_name] += 1
            return await _method(*args)

        setattr(store, name, wrapped)
    return calls


def _checkpoint(checkpoint_id: str) -> Any:
    return {
        "v": 1,
        "id": checkpoint_id,
        "ts": "2025-01-01T00:00:00+00:00",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }


def _conf(thread: str, checkpoint_id: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


@pytest.mark.asyncio
async def test_a_steps_writes_and_the_next_checkpoint_share_one_commit() -> None:
    store = await open_store("memory://")
    calls = counting(store)
    saver = WakefulSaver(store)
    reference = three_nodes(InMemorySaver())
    try:
        graph = three_nodes(saver)
        cfg: Any = {"configurable": {"thread_id": "t"}}
        result = await graph.ainvoke({"log": []}, cfg, durability="sync")
        assert result == {"log": ["a", "b", "c"]}
        # LangGraph calls put 5 times and put_writes 4 times; each put_writes is submitted in
        # the same loop iteration as a put, so 5 commits hold all 9 (the claim is separate).
        # A new thread's first claim (token 1) needs no read: nothing was ever committed.
        assert calls == Counter({"claim": 1, "commit": 5})
        ref_cfg: Any = {"configurable": {"thread_id": "t"}}
        await reference.ainvoke({"log": []}, ref_cfg, durability="sync")
        ours = [(s.values, s.next, s.metadata["step"]) async for s in graph.aget_state_history(cfg)]
        theirs = [
            (s.values, s.next, s.metadata["step"])
            async for s in reference.aget_state_history(ref_cfg)
        ]
        assert ours == theirs
        # what a fresh saver reads from storage is what the combined commits wrote
        fresh = WakefulSaver(store, fencing="off")
        stored = [(t.checkpoint["id"], t.pending_writes) async for t in fresh.alist(cfg)]
        cached = [(t.checkpoint["id"], t.pending_writes) async for t in saver.alist(cfg)]
        assert stored == cached and len(stored) == 5
    finally:
        await saver.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_appends_that_arrive_together_are_one_commit_and_each_is_answered() -> None:
    store = await open_store("memory://")
    saver = WakefulSaver(store)
    try:
        c1 = await saver.aput(_conf("t"), _checkpoint("c1"), {"step": 0}, {})
        calls = counting(store)
        answers = await asyncio.gather(
            saver.aput_writes(c1, [("log", ["x"])], "task-1"),
            saver.aput(c1, _checkpoint("c2"), {"step": 1}, {}),
            saver.aput_writes(c1, [("log", ["y"])], "task-2"),
        )
        assert calls == Counter({"commit": 1})
        assert answers[1]["configurable"]["checkpoint_id"] == "c2"
        first = await saver.aget_tuple(_conf("t", "c1"))
        assert first is not None
        assert first.pending_writes == [("task-1", "log", ["x"]), ("task-2", "log", ["y"])]
        latest = await WakefulSaver(store, fencing="off").aget_tuple(_conf("t"))
        assert latest is not None and latest.checkpoint["id"] == "c2"
    finally:
        await saver.aclose()
        await store.close()


class Opaque:
    """Only pickle serializes it."""

    def __init__(self, n: int) -> None:
        self.n = n


@contextlib.asynccontextmanager
async def _pickling_saver() -> AsyncIterator[tuple[Store, WakefulSaver]]:
    """A saver whose serializer would fall back to pickle (the saver refuses it), on a fresh
    memory store; both closed on exit."""
    store = await open_store("memory://")
    saver = WakefulSaver(store, serde=JsonPlusSerializer(pickle_fallback=True))
    try:
        yield store, saver
    finally:
        await saver.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_a_refused_value_fails_only_its_own_caller_in_a_batch() -> None:
    async with _pickling_saver() as (store, saver):
        c1 = await saver.aput(_conf("t"), _checkpoint("c1"), {"step": 0}, {})
        refused, stored = await asyncio.gather(
            saver.aput_writes(c1, [("log", Opaque(1))], "task-1"),
            saver.aput(c1, _checkpoint("c2"), {"step": 1}, {}),
            return_exceptions=True,
        )
        assert isinstance(refused, InvalidInput) and "pickle" in str(refused)
        assert not isinstance(stored, BaseException)
        reader = WakefulSaver(store, fencing="off")
        first = await reader.aget_tuple(_conf("t", "c1"))
        latest = await reader.aget_tuple(_conf("t"))
        assert first is not None and first.pending_writes == []
        assert latest is not None and latest.checkpoint["id"] == "c2"


@pytest.mark.asyncio
async def test_a_refusal_names_the_value_it_refuses() -> None:
    """The labels are formatted only when a value is refused: they still say which one."""
    async with _pickling_saver() as (_, saver):
        c1 = await saver.aput(_conf("t"), _checkpoint("c1"), {"step": 0}, {})
        with pytest.raises(InvalidInput) as write:
            await saver.aput_writes(c1, [("log", Opaque(1))], "task-1")
        assert write.value.field == "write of task 'task-1' to 'log'"
        body = _checkpoint("c2")
        body["channel_values"] = {"log": Opaque(2)}
        body["channel_versions"] = {"log": "1"}
        with pytest.raises(InvalidInput) as value:
            await saver.aput(c1, body, {"step": 1}, {"log": "1"})
        assert value.value.field == "checkpoint 'c2' channel 'log'"
        with pytest.raises(InvalidInput) as meta:
            await saver.aput(c1, _checkpoint("c3"), {"step": 1, "x": Opaque(3)}, {})  # type: ignore[typeddict-unknown-key]
        assert meta.value.field == "checkpoint 'c3' metadata"
        latest = await saver.aget_tuple(_conf("t"))
        assert latest is not None and latest.checkpoint["id"] == "c1"
        assert latest.pending_writes == []


@pytest.mark.asyncio
async def test_a_stale_batch_fails_every_caller_and_writes_nothing() -> None:
    clock = ManualClock()
    store = await open_store("memory://", clock=clock)
    first = WakefulSaver(store, holder="first", ttl=5, renew_every=4)
    second = WakefulSaver(store, holder="second", ttl=5, renew_every=4)
    try:
        c1 = await first.aput(_conf("t"), _checkpoint("c1"), {"step": 0}, {})
        clock.advance(6)  # first stalled past its claim: second takes over
        assert await second.aget_tuple({"configurable": {"thread_id": "t"}}) is not None
        await second.aput(c1, _checkpoint("c2"), {"step": 1}, {})
        before = await store.read("t")
        answers = await asyncio.gather(
            first.aput_writes(c1, [("log", ["late"])], "task-1"),
            first.aput(c1, _checkpoint("c3"), {"step": 1}, {}),
            return_exceptions=True,
        )
        assert [type(a) for a in answers] == [StaleClaim, StaleClaim]
        after = await store.read("t")
        assert before is not None and after is not None and after.version == before.version
        ids = [t.checkpoint["id"] async for t in second.alist({"configurable": {"thread_id": "t"}})]
        assert ids == ["c2", "c1"]
    finally:
        await first.aclose()
        await second.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_a_thread_claimed_before_is_read_after_the_claim() -> None:
    store = await open_store("memory://")
    saver = WakefulSaver(store, idle_release=0.5, renew_every=0.2, ttl=1)
    graph = three_nodes(saver)
    cfg: Any = {"configurable": {"thread_id": "t"}}
    try:
        await graph.ainvoke({"log": []}, cfg, durability="sync")
        await saver.release("t")
        other = WakefulSaver(store)
        await three_nodes(other).ainvoke({"log": ["x"]}, cfg, durability="sync")
        await other.aclose()
        calls = counting(store)
        # saver's cached index is behind the thread: its claim (token 3) must read
        result = await graph.ainvoke({"log": []}, cfg, durability="sync")
        assert calls["read"] >= 1 and calls["claim"] == 1
        assert result == {"log": ["a", "b", "c", "x", "a", "b", "c", "a", "b", "c"]}
        await saver.adelete_thread("t")
        calls.clear()
        # after a delete the epoch moved on: a new claim is not token 1, so it reads too
        result = await graph.ainvoke({"log": []}, cfg, durability="sync")
        assert result == {"log": ["a", "b", "c"]} and calls["read"] >= 1
    finally:
        await saver.aclose()
        await store.close()


@pytest.mark.asyncio
async def test_a_caller_cancelled_before_its_batch_is_written_leaves_the_rest_to_commit() -> None:
    store = await open_store("memory://")
    saver = WakefulSaver(store)
    try:
        c1 = await saver.aput(_conf("t"), _checkpoint("c1"), {"step": 0}, {})
        gone = asyncio.create_task(saver.aput_writes(c1, [("log", ["gone"])], "task-1"))
        kept = asyncio.create_task(saver.aput(c1, _checkpoint("c2"), {"step": 1}, {}))
        await asyncio.sleep(0)  # both joined one batch; its writer has not run yet
        gone.cancel()
        assert (await kept)["configurable"]["checkpoint_id"] == "c2"
        with pytest.raises(asyncio.CancelledError):
            await gone
        first = await WakefulSaver(store, fencing="off").aget_tuple(_conf("t", "c1"))
        assert first is not None and first.pending_writes == []
    finally:
        await saver.aclose()
        await store.close()
