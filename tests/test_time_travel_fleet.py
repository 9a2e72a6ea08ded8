"""``submit(..., from_checkpoint=...)`` (issue 37, item 2): the dispatch carries the
checkpoint, and the worker's run replays from it under the lease, branching the thread."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import wakeful
from tests.test_fleet_worker import Env, dispatch_status
from wakeful.agent import Agent
from wakeful.errors import InvalidInput, NotFound
from wakeful.fleet import edit_message, regenerate, submit
from wakeful.providers.scripted import Scripted


@pytest_asyncio.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


@pytest.mark.asyncio
async def test_a_run_submitted_from_a_checkpoint_replays_from_it_on_a_new_branch(
    env: Env,
) -> None:
    env.worker("w1")
    await submit(env.store, "t1", "echo", {"log": ["in"]}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "done")
    line = await wakeful.history(env.store, "t1")
    after_a = next(e for e in line if e.nodes == ["a"])
    d2 = await submit(
        env.store, "t1", "echo", dispatch_id="d2", from_checkpoint=after_a.checkpoint_id
    )
    assert d2.payload["from_checkpoint"] == after_a.checkpoint_id
    await env.wake.notify()
    await dispatch_status(env, "d2", "done")
    snap = await env.store.read("t1")
    assert snap is not None and snap.checkpoint is not None and snap.branch == 1
    assert snap.checkpoint.run_id == "run-d2" and snap.checkpoint.status == "completed"
    assert snap.checkpoint.state == {"log": ["in", "a", "b"]}
    assert env.calls == {"a": 1, "b": 2}, "only the step after the checkpoint ran again"
    (branch,) = await env.store.branches("t1")
    assert branch.fork_point == after_a.checkpoint_id and branch.old_head == line[0].checkpoint_id


@pytest.mark.asyncio
async def test_a_replay_the_worker_cannot_do_is_recorded_and_settled(env: Env) -> None:
    env.worker("w1")
    await submit(env.store, "t1", "echo", {"log": ["in"]}, dispatch_id="d1", wake=env.wake)
    await dispatch_status(env, "d1", "done")
    await submit(env.store, "t1", "echo", dispatch_id="d2", from_checkpoint="cp-gone")
    await env.wake.notify()
    await dispatch_status(env, "d2", "done")
    events = await env.store.events_after("t1", 0, 100)
    refused = [e for e in events if e.type == "dispatch.refused"]
    assert len(refused) == 1 and "cp-gone" in refused[0].data["reason"]
    assert await env.store.branches("t1") == [] and env.calls == {"a": 1, "b": 1}


@pytest.mark.asyncio
async def test_edit_message_and_regenerate_through_the_fleet(env: Env) -> None:
    model = Scripted.replies("one", "two", "two, edited", "two, edited, again")
    env.registry.add("helper", Agent("helper", model))
    env.worker("w1")
    for i, text in enumerate(("first", "second"), 1):
        await submit(env.store, "chat", "helper", text, dispatch_id=f"d{i}", wake=env.wake)
        await dispatch_status(env, f"d{i}", "done")
    second = (await env.store.messages("chat", 2, 1))[0]
    assert (second.role, second.content) == ("user", "second")

    await edit_message(env.store, "chat", "helper", second.id, "second, edited", dispatch_id="e1")
    await env.wake.notify()
    await dispatch_status(env, "e1", "done")
    said = [(m.role, m.content) for m in await env.store.messages("chat", 0, 100)]
    assert said == [
        ("user", "first"),
        ("assistant", "one"),
        ("user", "second, edited"),
        ("assistant", "two, edited"),
    ]

    await regenerate(env.store, "chat", "helper", dispatch_id="r1")
    await env.wake.notify()
    await dispatch_status(env, "r1", "done")
    said = [(m.role, m.content) for m in await env.store.messages("chat", 0, 100)]
    assert said[-1] == ("assistant", "two, edited, again") and said[:3] == [
        ("user", "first"),
        ("assistant", "one"),
        ("user", "second, edited"),
    ]
    assert len(await env.store.branches("chat")) == 2
    answer = (await env.store.messages("chat", 3, 1))[0]
    with pytest.raises(InvalidInput):
        await edit_message(env.store, "chat", "helper", answer.id, "not a user message")
    with pytest.raises(NotFound):
        await edit_message(env.store, "chat", "helper", second.id, "on the abandoned branch")
