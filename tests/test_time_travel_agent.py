"""Edit and regenerate for agents (issue 37, item 5): the thread branches at the checkpoint
that committed the user message, the model answers the edited (or the same) text from the
messages as of there, and the history shows both branches."""

from __future__ import annotations

import pytest

import wakeful
from wakeful import ManualClock
from wakeful.agent import Agent
from wakeful.errors import InvalidInput, NotFound, ThreadBusy
from wakeful.providers.scripted import Scripted
from wakeful.runtime import Runtime
from wakeful.store.memory import MemoryStore


async def _three_turns() -> tuple[MemoryStore, Runtime, Agent, Scripted]:
    clock = ManualClock()
    store = MemoryStore(clock)
    model = Scripted.replies("answer one", "answer two", "answer three", "answer edited")
    agent = Agent("helper", model)
    rt = Runtime(store, clock=clock)
    for text in ("first question", "second question", "third question"):
        reply = await agent.run(rt, "chat", text)
        assert reply.status == "completed"
    return store, rt, agent, model


def _said(messages: list[wakeful.Message]) -> list[tuple[str, str]]:
    return [(m.role, str(m.content)) for m in messages]


@pytest.mark.asyncio
async def test_editing_the_second_of_three_user_messages_answers_the_edited_text() -> None:
    store, rt, agent, model = await _three_turns()
    before = await store.messages("chat", 0, 100)
    old_head = (await wakeful.history(store, "chat", limit=1))[0]
    second = before[2]
    assert second.content == "second question"

    reply = await agent.edit(rt, "chat", second.id, "second question, edited")

    assert reply.status == "completed" and reply.text == "answer edited"
    # the model saw the conversation as of the edited message: nothing after it
    assert _said(list(model.requests[-1].messages)) == [
        ("user", "first question"),
        ("assistant", "answer one"),
        ("user", "second question, edited"),
    ]
    now = await store.messages("chat", 0, 100)
    assert _said(now) == [
        ("user", "first question"),
        ("assistant", "answer one"),
        ("user", "second question, edited"),
        ("assistant", "answer edited"),
    ]
    assert now[2].metadata == {"edits": second.id} and now[2].id != second.id
    # both branches in the history: the edit's on the head's line, the rest abandoned
    line = await wakeful.history(store, "chat", limit=100)
    assert {e.branch for e in line} == {0, 1}
    assert all(e.current for e in line if e.branch == 1) and line[0].branch == 1
    abandoned = [e for e in line if not e.current]
    assert old_head.checkpoint_id in {e.checkpoint_id for e in abandoned}
    assert {e.run_id for e in abandoned} >= {old_head.run_id}
    # nothing is lost: the old branch's conversation reads back as it was
    old = await wakeful.messages_at(store, "chat", old_head.checkpoint_id, limit=100)
    assert old == before and len(old) == 6
    (branch,) = await store.branches("chat")
    assert branch.old_head == old_head.checkpoint_id and branch.messages == 2
    # the edited line goes on like any other: regenerate answers the edited message again
    model.turns.append(Scripted.reply("answer edited, again"))
    again = await agent.regenerate(rt, "chat")
    assert again.text == "answer edited, again"
    assert _said(list(model.requests[-1].messages)) == _said(now[:3])
    assert _said(await store.messages("chat", 0, 100)) == [
        *_said(now[:3]),
        ("assistant", "answer edited, again"),
    ]


@pytest.mark.asyncio
async def test_regenerate_answers_the_last_user_message_again_on_a_new_branch() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    model = Scripted.replies("answer one", "answer two", "answer two, again")
    agent = Agent("helper", model)
    rt = Runtime(store, clock=clock)
    await agent.run(rt, "chat", "first question")
    await agent.run(rt, "chat", "second question")
    before = await store.messages("chat", 0, 100)

    reply = await agent.regenerate(rt, "chat")

    assert reply.text == "answer two, again"
    assert _said(list(model.requests[-1].messages)) == _said(before[:3])
    assert _said(await store.messages("chat", 0, 100)) == [
        *_said(before[:3]),
        ("assistant", "answer two, again"),
    ]
    assert await store.branch_messages("chat", 0, 0, 100) == before
    assert len(model.requests) == 3  # one model turn: the regenerated one


@pytest.mark.asyncio
async def test_edit_and_regenerate_are_refused_while_a_run_holds_the_thread() -> None:
    store, rt, agent, model = await _three_turns()
    first = (await store.messages("chat", 0, 1))[0]
    assistant = (await store.messages("chat", 1, 1))[0]
    with pytest.raises(InvalidInput):
        await agent.edit(rt, "chat", assistant.id, "not a user message")
    with pytest.raises(NotFound):
        await agent.edit(rt, "chat", "m-unknown", "x")
    claim = await store.claim("chat", "someone", 30)
    with pytest.raises(ThreadBusy):
        await agent.edit(rt, "chat", first.id, "edited")
    with pytest.raises(ThreadBusy):
        await agent.regenerate(rt, "chat")
    await store.release("chat", claim.token)
    assert await store.branches("chat") == [] and len(model.requests) == 3
