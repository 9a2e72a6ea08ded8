"""Conformance cases: time travel over the store (issue 37): a run replayed from an earlier
checkpoint, a state edit, a fork, and the history that shows the branches. They run the
runtime (``Runtime.replay``, ``Runtime.update_state``, ``wakeful.fork``, ``wakeful.history``)
against the store under test, so they check what those need of it end to end."""

from __future__ import annotations

import itertools
from typing import Annotated, Any, TypedDict

import msgspec
import pytest

from wakeful.errors import RunInProgress, ThreadBusy
from wakeful.records import Claim, Commit, Message, ThreadSnapshot
from wakeful.runtime import END, START, CompiledGraph, Graph, NodeContext, Runtime, append
from wakeful.runtime.history import fork, history, messages_at
from wakeful.testkit.harness import Harness, Kit

case = pytest.mark.asyncio


class Trail(TypedDict):
    trail: Annotated[list[str], append]
    total: int
    x: int


def _steps(ran: list[str]) -> CompiledGraph:
    """Five deterministic steps s1..s5 in a line; each records that it ran (in ``ran``),
    appends to the trail, doubles-and-adds the total and appends one message."""
    g = Graph(Trail, name="five")
    names = [f"s{i}" for i in range(1, 6)]

    def step(name: str, i: int) -> Any:
        def node(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
            ran.append(name)
            ctx.append_message(
                Message(id=f"m-{ctx.run_id}-{name}", role="assistant", content=f"{name} done")
            )
            return {"trail": [name], "total": int(state.get("total") or 0) * 2 + i}

        return node

    for i, name in enumerate(names, 1):
        g.node(name, step(name, i))
    g.edge(START, names[0])
    for a, b in itertools.pairwise(names):
        g.edge(a, b)
    g.edge(names[-1], END)
    return g.compile()


def _router(ran: list[str]) -> CompiledGraph:
    """``decide`` routes to ``pos`` when ``x > 0``, else to ``neg``."""
    g = Graph(Trail, name="router")

    def mark(name: str) -> Any:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            ran.append(name)
            return {"trail": [name]}

        return node

    g.node("decide", mark("decide")).node("pos", mark("pos")).node("neg", mark("neg"))
    g.edge(START, "decide")
    g.conditional_edge("decide", lambda s: "pos" if int(s.get("x") or 0) > 0 else "neg")
    g.edge("pos", END).edge("neg", END)
    return g.compile()


async def _run(rt: Runtime, thread_id: str, graph: CompiledGraph, **input: Any) -> Any:
    handle = await rt.start(
        thread_id,
        graph,
        {"trail": [], "total": 0, "x": 0, **input},
        messages=(Message(id=f"m-{thread_id}-in", role="user", content="go"),),
    )
    outcome = await handle.result()
    assert outcome.status == "completed"
    return outcome.state


class HistoryCases(Harness):
    @case
    async def test_replay_from_checkpoint_k_of_a_five_step_run_ends_as_the_original(
        self, kit: Kit
    ) -> None:
        ran: list[str] = []
        graph = _steps(ran)
        rt = Runtime(kit.store, clock=kit.clock)
        original = await _run(rt, "t1", graph)
        assert original["trail"] == ["s1", "s2", "s3", "s4", "s5"]
        line = await history(kit.store, "t1")
        assert [e.step for e in line] == [5, 4, 3, 2, 1, 0]
        assert line[0].nodes == ["s5"] and line[0].head and line[0].messages == 6
        old_head, fork_point = line[0], line[2]  # after s3
        assert fork_point.nodes == ["s3"] and fork_point.messages == 4
        ran.clear()
        handle = await rt.replay("t1", graph, fork_point.checkpoint_id)
        replayed = await handle.result()
        assert replayed.status == "completed"
        assert ran == ["s4", "s5"]  # only the steps after the fork point ran again
        assert replayed.state == original
        # the head's line: the original up to the fork point, then the replay
        now = await history(kit.store, "t1", limit=100)
        new = [e for e in now if e.branch == 1]
        assert [e.step for e in new] == [5, 4, 3] and all(e.current for e in new)
        assert new[0].head and new[-1].parent == fork_point.checkpoint_id
        abandoned = [e for e in now if e.branch == 0 and not e.current]
        assert [e.checkpoint_id for e in abandoned] == [
            line[0].checkpoint_id,
            line[1].checkpoint_id,
        ]
        assert [e.current for e in now if e.branch == 0][2:] == [True] * 4
        # the old branch stays readable: its checkpoints, and its messages as of its head
        old = await messages_at(kit.store, "t1", old_head.checkpoint_id, limit=100)
        assert [m.content for m in old][-2:] == ["s4 done", "s5 done"] and len(old) == 6
        current = await kit.store.messages("t1", 0, 100)
        assert len(current) == 6 and current[:4] == old[:4] and current[4:] != old[4:]
        (branch,) = await kit.store.branches("t1")
        assert (branch.fork_point, branch.old_head) == (
            fork_point.checkpoint_id,
            old_head.checkpoint_id,
        )
        events = await kit.store.events_after("t1", 0, 1000)
        branched = [e for e in events if e.type == "thread.branched"]
        assert len(branched) == 1
        assert branched[0].data["old_head"] == old_head.checkpoint_id
        assert branched[0].data["fork_point"] == fork_point.checkpoint_id

    @case
    async def test_a_replay_or_a_state_edit_under_a_live_claim_is_refused(self, kit: Kit) -> None:
        ran: list[str] = []
        graph = _steps(ran)
        rt = Runtime(kit.store, clock=kit.clock)
        await _run(rt, "t1", graph)
        first = (await history(kit.store, "t1"))[-1]
        before = await kit.store.read("t1")
        claim = await kit.store.claim("t1", "someone-else", 30)
        ran.clear()
        with pytest.raises(ThreadBusy):
            await rt.replay("t1", graph, first.checkpoint_id)
        with pytest.raises(ThreadBusy):
            await rt.update_state("t1", graph, {"x": 1}, checkpoint_id=first.checkpoint_id)
        after = await kit.store.read("t1")
        assert before is not None and after is not None
        assert after.version == before.version and after.checkpoint == before.checkpoint
        assert ran == [] and await kit.store.branches("t1") == []
        await kit.store.release("t1", claim.token)
        # a run that is unfinished but not live (its recovery is due) is not abandoned either
        await kit.store.commit(
            "t1",
            _unfinished(await kit.store.claim("t1", "crashed", 30), after),
        )
        with pytest.raises(RunInProgress):
            await rt.replay("t1", graph, first.checkpoint_id)

    @case
    async def test_update_state_as_node_routes_the_next_step_as_that_nodes_output_would(
        self, kit: Kit
    ) -> None:
        ran: list[str] = []
        graph = _router(ran)
        rt = Runtime(kit.store, clock=kit.clock)
        state = await _run(rt, "t1", graph, x=-1)
        assert state["trail"] == ["decide", "neg"]
        updated = await rt.update_state("t1", graph, {"x": 5}, as_node="decide")
        assert [e["node"] for e in updated.frontier] == ["pos"]
        assert updated.status == "suspended" and updated.state["x"] == 5
        ran.clear()
        outcome = await (await rt.replay("t1", graph, updated.id)).result()
        assert ran == ["pos"] and outcome.state["trail"] == ["decide", "neg", "pos"]
        # on an earlier checkpoint the edit branches: after ``decide`` ran, as if it said x=7
        line = await history(kit.store, "t1", limit=100)
        after_decide = next(e for e in line if e.nodes == ["decide"] and e.source == "loop")
        edited = await rt.update_state(
            "t1", graph, {"x": 7}, as_node="decide", checkpoint_id=after_decide.checkpoint_id
        )
        assert edited.parent == after_decide.checkpoint_id
        snap = await kit.store.read("t1")
        assert snap is not None and snap.checkpoint == edited and snap.branch == 1
        ran.clear()
        outcome = await (await rt.replay("t1", graph, edited.id)).result()
        assert ran == ["pos"] and outcome.state["trail"] == ["decide", "pos"]

    @case
    async def test_a_fork_shares_nothing_mutable_with_its_source(self, kit: Kit) -> None:
        ran: list[str] = []
        graph = _steps(ran)
        rt = Runtime(kit.store, clock=kit.clock)
        await _run(rt, "t1", graph)
        line = await history(kit.store, "t1")
        at = line[3]  # after s2
        copy = await fork(kit.store, "t1", "t2", checkpoint_id=at.checkpoint_id)
        source = await kit.store.get_checkpoint("t1", at.checkpoint_id)
        assert source is not None
        forked = await kit.store.read("t2")
        assert forked is not None and forked.checkpoint == copy
        assert copy.state == source.checkpoint.state and copy.frontier == source.checkpoint.frontier
        assert copy.status == "suspended"  # nothing runs on the fork until asked
        assert copy.id != source.checkpoint.id and copy.metadata["forked_from"] == {
            "thread_id": "t1",
            "checkpoint_id": at.checkpoint_id,
        }
        assert await kit.store.messages("t2", 0, 100) == await messages_at(
            kit.store, "t1", at.checkpoint_id
        )
        (event,) = await kit.store.events_after("t2", 0, 10)
        assert event.type == "thread.forked"
        assert event.data == {"source_thread": "t1", "checkpoint_id": at.checkpoint_id}
        # the fork runs on alone: its run ends where the source's did, the source unchanged
        ran.clear()
        outcome = await (await rt.replay("t2", graph, copy.id)).result()
        assert ran == ["s3", "s4", "s5"]
        assert outcome.state["trail"] == ["s1", "s2", "s3", "s4", "s5"]
        t1 = await kit.store.read("t1")
        assert t1 is not None and t1.checkpoint is not None
        assert t1.checkpoint.id == line[0].checkpoint_id and t1.branch == 0
        assert t1.message_count == 6 and await kit.store.branches("t1") == []
        assert len(await kit.store.messages("t2", 0, 100)) == 6
        # no value of the fork is a value of the source: changing what a read of the fork
        # returns (a store may hand out what it holds) leaves the source as it was
        mine = await kit.store.get_checkpoint("t2", copy.id)
        assert mine is not None
        mine.checkpoint.state["trail"].append("mutated")
        mine.checkpoint.frontier.clear()
        for message in await kit.store.messages("t2", 0, 100):
            message.metadata["mutated"] = True
        again = await kit.store.get_checkpoint("t1", at.checkpoint_id)
        assert again is not None and again.checkpoint.state["trail"] == ["s1", "s2"]
        assert again.checkpoint.frontier == source.checkpoint.frontier != []
        assert all("mutated" not in m.metadata for m in await kit.store.messages("t1", 0, 100))


def _unfinished(claim: Claim, snap: ThreadSnapshot) -> Commit:
    """A commit that leaves the thread's last run running (as a crashed one would)."""
    assert snap.checkpoint is not None
    cp = msgspec.structs.replace(
        snap.checkpoint,
        id="crashed-c0",
        parent=snap.checkpoint.id,
        run_id="crashed",
        status="running",
    )
    return Commit(token=claim.token, checkpoint=cp, release=True)
