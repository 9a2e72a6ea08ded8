"""Which target a thread's work goes to, and inputs a target cannot take (issue 16): a
registry never holds two targets a thread could not tell apart, a thread's later work goes to
the target that ran it, and an input that does not fit the graph is refused once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, TypedDict

import pytest
import pytest_asyncio

from tests.test_fleet_worker import Env, dispatch_status
from wakeful.errors import InvalidInput
from wakeful.fleet import Registry, send_message, submit
from wakeful.records import Checkpoint
from wakeful.runtime import START, Graph, NodeContext


class Counter(TypedDict):
    count: int
    label: str


def counter_graph(name: str = "graph") -> Any:
    async def bump(state: dict[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return {"count": int(state.get("count", 0)) + 1}

    return Graph(Counter, name=name).node("bump", bump).edge(START, "bump").compile()


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


def test_two_graphs_with_one_name_cannot_both_be_registered() -> None:
    first, second = counter_graph(), counter_graph()  # both compiled without a name: "graph"
    registry = Registry().add("A", first)
    with pytest.raises(InvalidInput, match="could not tell them apart"):
        registry.add("B", second)
    assert registry.names() == ["A"]
    registry.add("A", second)  # replacing a target under its own name is fine
    registry.add("alias", second)  # one compiled graph under two names: interchangeable
    assert registry.get("A").graph is second and registry.for_graph("graph").graph is second


def test_a_thread_s_recorded_target_wins_over_its_graph_name() -> None:
    shared = counter_graph("shared")
    registry = Registry(default="other").add("main", shared).add("mirror", shared)
    registry.add("other", counter_graph("other"))

    def checkpoint(metadata: dict[str, Any]) -> Checkpoint:
        return Checkpoint(
            id="c1",
            parent=None,
            run_id="r1",
            status="completed",
            state={},
            created_at=datetime.now(UTC),
            metadata=metadata,
        )

    assert registry.for_checkpoint(checkpoint({"graph": "shared", "target": "mirror"})).name == (
        "mirror"
    )
    assert registry.for_checkpoint(checkpoint({"graph": "other"})).name == "other"
    assert registry.for_checkpoint(None).name == "other"  # the default, for a new thread


@pytest.mark.parametrize(
    ("bad", "field", "says"),
    [
        ("a string", "input", "takes a JSON object"),
        ([1, 2], "input", "takes a JSON object"),
        ({"count": 1, "colour": "red"}, "input", "no state fields .'colour'."),
        ({"count": "many"}, "input.count", "Expected `int`"),
    ],
)
def test_an_input_that_does_not_fit_the_graph_is_invalid_input(
    bad: Any, field: str, says: str
) -> None:
    target = Registry().add("counter", counter_graph()).get("counter")
    with pytest.raises(InvalidInput, match=says) as refused:
        target.check_input(bad)
    assert refused.value.field == field
    assert target.check_input({"count": 3}) == {"count": 3}
    assert target.check_input(None) == {}


@pytest.mark.asyncio
async def test_an_input_that_does_not_fit_is_refused_once_not_retried(env: Env) -> None:
    env.registry.add("counter", counter_graph())
    env.worker("w1")
    bad = [("d1", {"colour": "red"}), ("d2", {"count": "many"}), ("d3", "a string")]
    for n, (dispatch_id, value) in enumerate(bad):
        await submit(env.store, f"t{n}", "counter", value, dispatch_id=dispatch_id, wake=env.wake)
    for n, (dispatch_id, _) in enumerate(bad):
        await dispatch_status(env, dispatch_id, "done")
        assert (await env.dispatch(dispatch_id)).attempts == 1
        events = await env.store.events_after(f"t{n}", 0, 100)
        assert [e.type for e in events] == ["dispatch.refused"], events
        assert await env.status(f"t{n}") is None  # no run was started


@pytest.mark.asyncio
async def test_a_message_goes_to_the_target_that_ran_the_thread(env: Env) -> None:
    env.registry.add("other", env.graph("other", ["x"]))
    env.registry.default = "other"
    env.worker("w1")
    await submit(env.store, "t1", "echo", {"log": ["in"]}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "done")
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.metadata["target"] == "echo"
    sent = await send_message(env.store, "t1", {"log": ["hello"]}, wake=env.wake)
    await dispatch_status(env, sent.dispatch_id, "done")
    assert env.calls == {"a": 2, "b": 2}  # echo ran it again; "other" (x) never did
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None
    assert snap.checkpoint.metadata["target"] == "echo"
