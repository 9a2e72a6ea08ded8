"""Subgraphs: a compiled graph as a node. State in and out (shared fields, mappings), a
SIGKILL inside the subgraph recovered without rerunning its finished steps, interrupts inside
it (also nested), fan-out over it, and what each durability mode stores."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from tests.runtime_support import eventually, kill_when_ready, store_url
from tests.subgraph_child import Inner, Outer, build
from wakeful import ManualClock, history, open_store
from wakeful.errors import CheckpointWriteFailed, GraphInvalid, RunFailed
from wakeful.runtime import START, ClaimPolicy, Graph, NodeContext, Runtime, Send, append
from wakeful.store.memory import MemoryStore


async def completed(runtime: Runtime, graph: Any, input: dict[str, Any], thread: str) -> Any:
    outcome = await (await runtime.start(thread, graph, input)).result()
    assert outcome.status == "completed"
    return outcome.state


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_sigkill_after_the_subgraphs_second_step_resumes_inside_it(
    kind: str, tmp_path: Path
) -> None:
    url = store_url(kind, tmp_path)
    counter, ready = tmp_path / "calls.txt", tmp_path / "ready"
    argv = ["tests.subgraph_child", url, str(counter), str(ready)]
    await asyncio.to_thread(kill_when_ready, argv, [ready])
    assert counter.read_text().split() == ["before", "plan", "search", "write"]

    clock = ManualClock(datetime.now(UTC) + timedelta(seconds=60))  # past the dead claim
    store = await open_store(url, clock=clock)
    try:
        runtime = Runtime(store, ClaimPolicy(ttl=30, renew_every=10), clock, holder="parent")
        outcome = await (await runtime.recover("t", build(counter, hang=False))).result()
        assert outcome.status == "completed"
        calls = counter.read_text().split()
        assert calls == ["before", "plan", "search", "write", "write", "after"], (
            "the subgraph's first two steps were reused; only its step in flight ran again"
        )
        baseline_counter = tmp_path / "baseline.txt"
        baseline = await completed(
            Runtime(MemoryStore(ManualClock())),
            build(baseline_counter, hang=False),
            {"topic": "tides"},
            "t",
        )
        assert outcome.state == baseline
    finally:
        await store.close()


def test_shared_fields_go_in_and_the_childs_final_values_come_out() -> None:
    seen: list[dict[str, Any]] = []

    def child(state: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(state))
        return {"notes": ["n"], "report": f"on {state['topic']}"}

    research = Graph(Inner, name="r").node("c", child).edge(START, "c").compile()
    parent = Graph(Outer).node("research", research).edge(START, "research").compile()
    state = asyncio.run(
        completed(Runtime(MemoryStore(ManualClock())), parent, {"topic": "x", "log": ["l"]}, "t")
    )
    assert seen == [{"topic": "x"}], "only the shared fields went in (not log)"
    assert state == {"topic": "x", "log": ["l"], "report": "on x"}, "notes stayed inside"


def test_input_and_output_mappings_connect_states_that_share_no_fields() -> None:
    class Question(TypedDict):
        q: str
        answers: Annotated[list[str], append]

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        return {"answers": [state["q"].upper()]}

    sub = Graph(Question, name="qa").node("a", answer).edge(START, "a").compile()
    with pytest.raises(GraphInvalid, match="share no state fields"):
        Graph(Outer).node("qa", sub)
    with pytest.raises(GraphInvalid, match="not a field of subgraph 'qa'"):
        Graph(Outer).node("qa", sub, input={"topic": "nope"}, output={"log": "answers"})
    with pytest.raises(GraphInvalid, match="for subgraph nodes"):
        Graph(Outer).node("f", lambda s: None, input={"topic": "q"})
    parent = Graph(Outer).node("qa", sub, input={"topic": "q"}, output={"log": "answers"})
    state = asyncio.run(
        completed(
            Runtime(MemoryStore(ManualClock())),
            parent.edge(START, "qa").compile(),
            {"topic": "why", "log": ["start"]},
            "t",
        )
    )
    assert state["log"] == ["start", "WHY"], "the child's answers appended through log's reducer"


def test_a_subgraph_change_changes_its_parents_fingerprint() -> None:
    def parent(extra: bool) -> str:
        inner = Graph(Inner, name="r").node("a", lambda s: None).edge(START, "a")
        if extra:
            inner.node("b", lambda s: None).edge("a", "b")
        g = Graph(Outer).node("research", inner.compile()).edge(START, "research")
        return g.compile().fingerprint

    assert parent(False) == parent(False)
    assert parent(False) != parent(True)


def asking(calls: list[str], name: str = "inner") -> Any:
    """A 3-step subgraph: ``a``, then ``ask`` (an interrupt), then ``b``."""

    def a(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("a")
        return {"notes": ["a"]}

    def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        calls.append("ask")
        return {"notes": [f"answer:{ctx.interrupt('go on?')}"]}

    def b(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("b")
        return {"report": "/".join(state["notes"])}

    g = Graph(Inner, name=name).node("a", a).node("ask", ask).node("b", b)
    return g.edge(START, "a").edge("a", "ask").edge("ask", "b").compile()


@pytest.mark.asyncio
@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_an_interrupt_inside_a_subgraph_suspends_the_run_and_resume_continues_inside(
    durability: str,
) -> None:
    calls: list[str] = []
    graph = Graph(Outer).node("research", asking(calls)).edge(START, "research").compile()
    store = MemoryStore(ManualClock())
    runtime = Runtime(store)
    handle = await runtime.start("t", graph, {"topic": "x"}, durability=durability)
    suspended = await handle.result()
    assert suspended.status == "suspended"
    assert [t.id for t in suspended.tickets] == ["research/ask-i1"]
    assert suspended.tickets[0].question == "go on?"
    done = await (await runtime.resume("t", graph, {"research/ask-i1": "yes"})).result()
    assert done.status == "completed"
    assert done.state["report"] == "a/answer:yes"
    assert calls == ["a", "ask", "ask", "b"], "a ran once: the suspension kept the snapshot"


@pytest.mark.asyncio
async def test_an_interrupt_in_a_subgraph_inside_a_subgraph_names_the_whole_path() -> None:
    calls: list[str] = []
    middle = Graph(Inner, name="middle").node("deep", asking(calls, "deep"))
    middle.node("tail", lambda s: {"notes": ["tail"]}).edge(START, "deep").edge("deep", "tail")
    graph = Graph(Outer).node("outer", middle.compile()).edge(START, "outer").compile()
    runtime = Runtime(MemoryStore(ManualClock()))
    suspended = await (await runtime.start("t", graph, {"topic": "x"})).result()
    assert [t.id for t in suspended.tickets] == ["outer/deep/ask-i1"]
    done = await (await runtime.resume("t", graph, {"outer/deep/ask-i1": 7})).result()
    assert done.status == "completed" and done.state["report"] == "a/answer:7"
    assert calls == ["a", "ask", "ask", "b"]
    # the history shows the nesting: the checkpoint the subgraph node produced says what ran
    entries = await history(runtime.store, "t")
    produced = [e for e in entries if e.subgraphs]
    assert [(e.nodes, e.status) for e in produced] == [(["outer"], "completed")]
    assert [e.subgraphs for e in produced] == [
        {
            "outer": {"graph": "middle", "steps": [["deep"], ["tail"]]},
            "outer/deep": {"graph": "deep", "steps": [["a"], ["ask"], ["b"]]},
        }
    ]


@pytest.mark.asyncio
async def test_a_later_question_with_the_same_path_is_not_answered_by_the_earlier_answer() -> None:
    asked: list[Any] = []

    def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        answer = ctx.interrupt(len(state.get("notes", [])))
        asked.append(answer)
        return {"notes": [str(answer)]}

    loop = Graph(Inner, name="loop").node("ask", ask).edge(START, "ask")
    loop.conditional_edge("ask", lambda s: "ask" if len(s["notes"]) < 2 else "__end__")
    graph = Graph(Outer).node("r", loop.compile()).edge(START, "r").compile()
    runtime = Runtime(MemoryStore(ManualClock()))
    first = await (await runtime.start("t", graph, {"topic": "x"})).result()
    assert [t.id for t in first.tickets] == ["r/ask-i1"] and first.tickets[0].question == 0
    second = await (await runtime.resume("t", graph, {"r/ask-i1": "one"})).result()
    assert second.status == "suspended", "the second ask is a new question"
    assert [t.id for t in second.tickets] == ["r/ask-i1"] and second.tickets[0].question == 1
    done = await (await runtime.resume("t", graph, {"r/ask-i1": "two"})).result()
    assert done.status == "completed" and asked == ["one", "two"]


@pytest.mark.asyncio
async def test_subgraphs_in_parallel_branches_run_once_each_and_name_their_tickets() -> None:
    class Fan(TypedDict):
        topics: list[str]
        reports: Annotated[list[str], append]

    calls: list[str] = []

    def research(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        calls.append(state["topic"])
        if state["topic"] == "b":
            ctx.interrupt("b?")
        return {"report": f"r-{state['topic']}"}

    sub = Graph(Inner, name="r").node("work", research).edge(START, "work").compile()
    g = Graph(Fan).node("research", sub, input={"topics": "topic"}, output={"reports": "report"})
    g.conditional_edge(START, lambda s: [Send("research", {"topics": t}) for t in s["topics"]])
    graph = g.compile()
    runtime = Runtime(MemoryStore(ManualClock()))
    suspended = await (await runtime.start("t", graph, {"topics": ["a", "b"]})).result()
    assert [t.id for t in suspended.tickets] == ["research@s0-t1/work-i1"]
    done = await (await runtime.resume("t", graph, {"research@s0-t1/work-i1": 1})).result()
    assert done.status == "completed"
    assert done.state["reports"] == ["r-a", "r-b"], "in frontier order"
    assert calls == ["a", "b", "b"], "the branch that finished was not run again"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("durability", "stored"), [("sync", True), ("async", True), ("exit", False)]
)
async def test_durability_modes_decide_when_the_subgraphs_snapshots_are_stored(
    durability: str, stored: bool
) -> None:
    gate, reached = asyncio.Event(), asyncio.Event()

    def step(name: str) -> Any:
        async def node(state: dict[str, Any]) -> dict[str, Any]:
            if name == "write":
                reached.set()
                await gate.wait()
            return {"notes": [name], "report": name}

        return node

    inner = Graph(Inner, name="r").node("plan", step("plan")).node("search", step("search"))
    inner.node("write", step("write")).edge(START, "plan").edge("plan", "search")
    graph = (
        Graph(Outer)
        .node("research", inner.edge("search", "write").compile())
        .edge(START, "research")
        .compile()
    )
    store = MemoryStore(ManualClock())
    handle = await Runtime(store).start("t", graph, {"topic": "x"}, durability=durability)
    snapshots: list[str] = []

    async def written() -> bool:
        snap = await store.read("t")
        assert snap is not None
        snapshots[:] = [w.task_id for w in snap.writes]
        return len(snapshots) == 2

    await asyncio.wait_for(reached.wait(), 10)  # the child's third step is running
    if stored:
        await eventually(written)  # sync: already; async: once its writer drains
        assert snapshots == ["s0-t0:research:c1", "s0-t0:research:c2"]
    else:
        await written()
        assert snapshots == [], "exit mode folds them into the run's one final commit"
    gate.set()
    outcome = await handle.result()
    assert outcome.status == "completed" and outcome.state["report"] == "write"


@pytest.mark.asyncio
async def test_a_recovered_subgraph_does_not_offer_an_answer_its_completed_step_consumed() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    gate, hanging = asyncio.Event(), asyncio.Event()
    attempts = {"first": True}

    async def ask(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        if state.get("notes") and attempts["first"]:
            hanging.set()
            await gate.wait()  # the first attempt dies here, in the child's second step
        return {"notes": [str(ctx.interrupt(len(state.get("notes", []))))]}

    loop = Graph(Inner, name="loop").node("ask", ask).edge(START, "ask")
    loop.conditional_edge("ask", lambda s: "ask" if len(s["notes"]) < 2 else "__end__")
    graph = Graph(Outer).node("r", loop.compile()).edge(START, "r").compile()
    first = Runtime(store, holder="first")
    await (await first.start("t", graph, {"topic": "x"})).result()
    abandoned = await first.resume("t", graph, {"r/ask-i1": "one"})
    await asyncio.wait_for(hanging.wait(), 10)
    attempts["first"] = False
    clock.advance(31)  # the first attempt's claim lapses
    recovered = await (await Runtime(store, holder="second").recover("t", graph)).result()
    assert recovered.status == "suspended", "the answer to the first question is not reused"
    assert [t.id for t in recovered.tickets] == ["r/ask-i1"] and recovered.tickets[0].question == 1
    gate.set()
    with pytest.raises(CheckpointWriteFailed):  # the abandoned attempt records nothing more
        await abandoned.result()


def parallel_child(calls: list[str], block: asyncio.Event | None, ask: bool) -> Any:
    """A subgraph whose first superstep runs ``a`` and ``b`` in parallel: ``b`` waits on
    ``block`` (when given) or asks a question (``ask``)."""

    async def a(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("a")
        return {"notes": ["a"]}

    async def b(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        calls.append("b")
        if block is not None:
            await block.wait()
        answer = ctx.interrupt("b?") if ask else "-"
        return {"notes": [f"b{answer}"]}

    g = Graph(Inner, name="par").node("a", a).node("b", b)
    g.node("join", lambda s: {"report": ",".join(sorted(s["notes"]))})
    g.edge(START, "a").edge(START, "b").edge("a", "join").edge("b", "join")
    return Graph(Outer).node("r", g.compile()).edge(START, "r").compile()


@pytest.mark.asyncio
async def test_a_finished_task_of_a_parallel_child_superstep_is_reused_after_a_crash() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    calls: list[str] = []
    block = asyncio.Event()
    abandoned = await Runtime(store, holder="first").start(
        "t", parallel_child(calls, block, ask=False), {"topic": "x"}
    )

    async def a_written() -> bool:
        snap = await store.read("t")
        return snap is not None and [w.task_id for w in snap.writes] == ["s0-t0:r:s0-t0"]

    await eventually(a_written)  # a's result is committed under its namespaced task id
    clock.advance(31)  # the first attempt's claim lapses while b hangs
    graph = parallel_child(calls, None, ask=False)
    outcome = await (await Runtime(store, holder="second").recover("t", graph)).result()
    assert outcome.state["report"] == "a,b-"
    assert calls == ["a", "b", "b"], "a finished before the crash and was not run again"
    block.set()
    with pytest.raises(CheckpointWriteFailed):
        await abandoned.result()


@pytest.mark.asyncio
async def test_a_suspension_keeps_the_finished_siblings_of_an_interrupted_child_task() -> None:
    calls: list[str] = []
    graph = parallel_child(calls, None, ask=True)
    runtime = Runtime(MemoryStore(ManualClock()))
    suspended = await (await runtime.start("t", graph, {"topic": "x"})).result()
    assert [t.id for t in suspended.tickets] == ["r/b-i1"]
    done = await (await runtime.resume("t", graph, {"r/b-i1": "!"})).result()
    assert done.state["report"] == "a,b!"
    assert calls == ["a", "b", "b"]


@pytest.mark.asyncio
async def test_a_failing_child_node_fails_the_run_naming_the_subgraph_node() -> None:
    def broken(state: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("no sources")

    sub = Graph(Inner, name="r").node("search", broken).edge(START, "search").compile()
    graph = Graph(Outer).node("research", sub).edge(START, "research").compile()
    handle = await Runtime(MemoryStore(ManualClock())).start("t", graph, {"topic": "x"})
    with pytest.raises(RunFailed, match="node 'research' failed: ValueError: no sources"):
        await handle.result()
