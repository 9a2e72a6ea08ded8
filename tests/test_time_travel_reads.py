"""Time travel's reads and refusals (issue 37): one checkpoint in full, tenants, checkpoints
without a message count, and what ``fork``, ``replay`` and ``update_state`` refuse."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest

import wakeful
from wakeful import ManualClock
from wakeful.errors import (
    GraphChanged,
    InvalidInput,
    InvalidState,
    NotFound,
    TenantMismatch,
)
from wakeful.records import Checkpoint, Commit, Message
from wakeful.runtime import END, START, Graph, Runtime, append
from wakeful.runtime.history import thread_branches
from wakeful.store.memory import MemoryStore


class State(TypedDict):
    log: Annotated[list[str], append]


def _graph(longer: bool = False) -> Any:
    def node(tag: str) -> Any:
        def fn(state: dict[str, Any]) -> dict[str, Any]:
            return {"log": [tag]}

        return fn

    g = Graph(State, name="line").node("a", node("a")).node("b", node("b"))
    g.edge(START, "a").edge("a", "b")
    if longer:  # another version of the graph: another fingerprint
        return g.node("c", node("c")).edge("b", "c").edge("c", END).compile()
    return g.edge("b", END).compile()


async def _finished(tenant: str | None = None) -> tuple[MemoryStore, Runtime]:
    clock = ManualClock()
    store = MemoryStore(clock)
    rt = Runtime(store, clock=clock)
    user = Message(id="m-in", role="user", content="hello")
    handle = await rt.start("t1", _graph(), {"log": []}, tenant=tenant, messages=(user,))
    assert (await handle.result()).status == "completed"
    return store, rt


@pytest.mark.asyncio
async def test_a_checkpoint_reads_in_full_with_its_entry_and_its_messages() -> None:
    store, _ = await _finished()
    line = await wakeful.history(store, "t1")
    after_a = next(e for e in line if e.nodes == ["a"])
    view = await wakeful.checkpoint_at(store, "t1", after_a.checkpoint_id)
    assert view.entry == after_a and view.checkpoint.state == {"log": ["a"]}
    assert [t["node"] for t in view.checkpoint.frontier] == ["b"]
    assert [m.id for m in await wakeful.messages_at(store, "t1", after_a.checkpoint_id)] == ["m-in"]
    assert await wakeful.messages_at(store, "t1", after_a.checkpoint_id, after=1) == []
    page = await wakeful.history(store, "t1", limit=1)
    assert page == line[:1] and page[0].head
    assert await wakeful.history(store, "t1", before=line[0].checkpoint_id) == line[1:]
    with pytest.raises(NotFound):
        await wakeful.checkpoint_at(store, "t1", "cp-unknown")
    with pytest.raises(NotFound):
        await wakeful.history(store, "never-seen")


@pytest.mark.asyncio
async def test_reads_and_forks_are_refused_for_another_tenant_and_forks_keep_the_tenant() -> None:
    store, _ = await _finished(tenant="acme")
    with pytest.raises(TenantMismatch):
        await wakeful.history(store, "t1", tenant="other")
    with pytest.raises(TenantMismatch):
        await wakeful.fork(store, "t1", "t2", tenant="other")
    assert await wakeful.history(store, "t1", tenant="acme")
    with pytest.raises(TenantMismatch):
        await thread_branches(store, "t1", tenant="other")
    assert await thread_branches(store, "t1", tenant="acme") == []
    copy = await wakeful.fork(store, "t1", "t2", tenant="acme")
    snap = await store.read("t2")
    assert snap is not None and snap.tenant == "acme" and copy.tenant == "acme"


@pytest.mark.asyncio
async def test_fork_refuses_a_thread_with_history_and_its_own_source() -> None:
    store, _ = await _finished()
    await wakeful.fork(store, "t1", "t2")
    before = await store.read("t2")
    with pytest.raises(InvalidState):
        await wakeful.fork(store, "t1", "t2")
    with pytest.raises(InvalidState):
        await wakeful.fork(store, "t1", "t1")
    assert await store.read("t2") == before


@pytest.mark.asyncio
async def test_replay_and_update_state_refuse_what_they_cannot_do() -> None:
    store, rt = await _finished()
    line = await wakeful.history(store, "t1")
    first = line[-1].checkpoint_id
    with pytest.raises(NotFound):
        await rt.replay("t1", _graph(), "cp-unknown")
    with pytest.raises(GraphChanged):
        await rt.replay("t1", _graph(longer=True), first)
    with pytest.raises(InvalidInput):
        await rt.replay("t1", _graph(), first, keep_messages=5)  # it has 1 message
    with pytest.raises(InvalidInput):
        await rt.update_state("t1", _graph(), {"log": ["x"]}, as_node="nope")
    snap = await store.read("t1")
    assert snap is not None and snap.version == 3 and await store.branches("t1") == []


@pytest.mark.asyncio
async def test_a_checkpoint_without_a_message_count_is_refused_once_messages_exist() -> None:
    """A checkpoint written without ``metadata["messages"]`` (an older wakeful, a LangGraph
    saver) on a line with messages: the messages as of it are unknown, so nothing guesses."""
    store, _ = await _finished()
    claim = await store.claim("t1", "old-writer", 30)
    snap = await store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    old = Checkpoint(
        id="old-1",
        parent=snap.checkpoint.id,
        run_id="old",
        status="completed",
        state={"log": []},
        created_at=snap.checkpoint.created_at,
    )
    newer = Checkpoint(
        id="old-2",
        parent="old-1",
        run_id="old",
        status="completed",
        state={"log": []},
        created_at=snap.checkpoint.created_at,
    )
    for cp in (old, newer):
        await store.commit("t1", Commit(token=claim.token, checkpoint=cp))
    await store.release("t1", claim.token)
    entry = (await wakeful.history(store, "t1", limit=2))[1]
    assert entry.checkpoint_id == "old-1" and entry.messages is None
    with pytest.raises(InvalidState):
        await wakeful.messages_at(store, "t1", "old-1")
    # the head's count is the thread's, recorded or not
    assert len(await wakeful.messages_at(store, "t1", "old-2")) == 1
